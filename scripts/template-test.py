"""Runs SAM's own transform (samtranslator, as `sam deploy` does) on template.yaml with
the parameter sets a team may deploy, resolves the conditions of each, and checks the
generated resources: what cfn-lint and `sam validate` cannot see.

Run by scripts/lint-template with the SAM CLI's Python (.venv-sam), offline.
"""

import copy
import functools
import json
import logging
import os
import subprocess
import sys
import tempfile
from pathlib import Path

# The transform names resources by region; offline, it has to be told one.
os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")
logging.disable(logging.WARNING)

from samcli.cli.types import CfnParameterOverridesType
from samtranslator.translator.transform import transform
from samtranslator.yaml_helper import yaml_parse

ROOT = Path(__file__).resolve().parent.parent
BASE = {
    "WechatAppId": "wx1234567890abcdef",
    "WechatSecretArn": "arn:aws:secretsmanager:us-east-1:123456789012:secret:onegrant/app-AbCdEf",
    "Templates": '[{"id":"tmpl_water_reminder","title":"t","keywords":{}}]',
    "Reminders": '[{"kind":"water","template_id":"tmpl_water_reminder"}]',
}
PUSH = {
    "WechatPushTokenSecretArn": "arn:aws:secretsmanager:us-east-1:123456789012:secret:onegrant/push-AbCdEf",
    "WechatPushAesKeySecretArn": "arn:aws:secretsmanager:us-east-1:123456789012:secret:onegrant/aes-AbCdEf",
    "WechatOriginalId": "gh_123456789abc",
}
TOPIC = "arn:aws:sns:us-east-1:123456789012:onegrant-alarms"
PSEUDO = {
    "AWS::Region": "us-east-1",
    "AWS::AccountId": "123456789012",
    "AWS::Partition": "aws",
    "AWS::StackName": "onegrant",
    "AWS::URLSuffix": "amazonaws.com",
}
NO_VALUE = object()


class NoManagedPolicies:
    """The template names no managed policy by name: nothing to look up."""

    def load(self):
        return {}


class Stack:
    """The transformed template with one parameter set, conditions resolved."""

    pseudo = PSEUDO

    def __init__(self, overrides):
        template = yaml_parse((ROOT / "template.yaml").read_text())
        params = {
            name: str(spec.get("Default", ""))
            for name, spec in template.get("Parameters", {}).items()
        }
        params.update(BASE)
        params.update(overrides)
        self.params = params
        self.rules_failed = failed_rules(template, params)
        # As `sam deploy` hands it over: each function's code uploaded to S3.
        for name, res in template["Resources"].items():
            if res["Type"] == "AWS::Serverless::Function":
                res["Properties"]["CodeUri"] = f"s3://onegrant-artifacts/{name}.zip"
        out = transform(copy.deepcopy(template), dict(params), NoManagedPolicies())
        self.conditions = {}
        self.raw_conditions = out.get("Conditions", {})
        self.resources = {
            name: res
            for name, res in out["Resources"].items()
            if "Condition" not in res or self.condition(res["Condition"])
        }

    def condition(self, name):
        if name not in self.conditions:
            self.conditions[name] = bool(self.value(self.raw_conditions[name]))
        return self.conditions[name]

    def value(self, node):
        """`node` with Ref, Fn::If, Fn::Equals, Fn::Not, Fn::And, Fn::Or, Fn::Contains
        and Condition resolved; other functions are left as they are."""
        if isinstance(node, list):
            return [v for v in (self.value(x) for x in node) if v is not NO_VALUE]
        if not isinstance(node, dict):
            return node
        if len(node) == 1:
            (key, arg), = node.items()
            if key == "Ref":
                if arg == "AWS::NoValue":
                    return NO_VALUE
                if arg in self.params:
                    return self.params[arg]
                if arg in self.pseudo:
                    return self.pseudo[arg]
                return node
            if key == "Fn::If":
                name, then, other = arg
                return self.value(then if self.condition(name) else other)
            if key == "Fn::Equals":
                a, b = (self.value(x) for x in arg)
                return str(a) == str(b)
            if key == "Fn::Not":
                return not self.value(arg[0])
            if key == "Fn::And":
                return all(self.value(x) for x in arg)
            if key == "Fn::Or":
                return any(self.value(x) for x in arg)
            if key == "Fn::Contains":  # (a rule function)
                values, one = (self.value(x) for x in arg)
                return str(one) in [str(v) for v in values]
            if key == "Condition":
                return self.condition(arg)
            if key in ("Fn::Join", "Fn::Split", "Fn::Select"):
                resolved = [self.value(x) for x in arg]
                if not all(isinstance(x, (str, int, list)) for x in resolved):
                    return node
                if key == "Fn::Join":
                    delimiter, items = resolved
                    # (A CommaDelimitedList parameter's Ref is held as its text.)
                    items = items.split(",") if isinstance(items, str) else items
                    return delimiter.join(str(x) for x in items)
                if key == "Fn::Split":
                    delimiter, text = resolved
                    return text.split(delimiter)
                index, items = resolved
                return items[int(index)]
        return {
            k: v for k, v in ((k, self.value(v)) for k, v in node.items()) if v is not NO_VALUE
        }

    def of_type(self, kind):
        return {n: self.value(r) for n, r in self.resources.items() if r["Type"] == kind}

    def function(self, logical_id):
        res = self.resources.get(logical_id)
        return self.value(res)["Properties"] if res else None

    def routes(self):
        """The HTTP API's routes ("GET /path"), from the API's body and route resources."""
        found = set()
        for api in self.of_type("AWS::ApiGatewayV2::Api").values():
            for path, methods in api["Properties"].get("Body", {}).get("paths", {}).items():
                for method in methods:
                    found.add(f"{method.upper()} {path}")
        for route in self.of_type("AWS::ApiGatewayV2::Route").values():
            found.add(route["Properties"]["RouteKey"])
        return found


@functools.lru_cache(maxsize=1)
def template_yaml():
    """template.yaml as parsed (read once; not to be changed)."""
    return yaml_parse((ROOT / "template.yaml").read_text())


def failed_rules(template, params, pseudo=None):
    """The template's Rules whose assertions fail with `params` (evaluated as
    CloudFormation does before creating anything), in the region of `pseudo`."""
    stack = Stack.__new__(Stack)
    stack.params, stack.conditions, stack.raw_conditions = params, {}, {}
    if pseudo is not None:
        stack.pseudo = pseudo
    failed = []
    for name, rule in template.get("Rules", {}).items():
        if "RuleCondition" in rule and not stack.value(rule["RuleCondition"]):
            continue
        if not all(stack.value(a["Assert"]) for a in rule["Assertions"]):
            failed.append(name)
    return failed


def schedule_states(stack, function="DispatcherFunction"):
    """The states of the schedules that invoke `function`."""
    return [
        rule["Properties"].get("State")
        for rule in stack.of_type("AWS::Events::Rule").values()
        if "ScheduleExpression" in rule["Properties"]
        and any(function in json.dumps(t) for t in rule["Properties"].get("Targets", []))
    ]


CHECKS = []


def check(fn):
    CHECKS.append(fn)
    return fn


@check
def the_dispatcher_switch_turns_the_schedule_off():
    assert schedule_states(Stack({"DispatcherEnabled": "true"})) == ["ENABLED"]
    off = Stack({"DispatcherEnabled": "false"})
    assert schedule_states(off) == ["DISABLED"], schedule_states(off)
    assert not off.of_type("AWS::CloudWatch::Alarm").get("MissedTicksAlarm")
    # The outcomes' own schedule runs either way: a paused dispatcher still tells what
    # already happened.
    assert schedule_states(off, "OutcomesFunction") == [None], schedule_states(off, "OutcomesFunction")


@check
def reserved_concurrency_is_optional():
    default = Stack({})
    assert default.function("DispatcherFunction")["ReservedConcurrentExecutions"] == "20"
    assert default.function("NotifyFunction")["ReservedConcurrentExecutions"] == "5"
    none = Stack({"DispatcherConcurrency": "0", "NotifyConcurrency": "0"})
    for name in ["DispatcherFunction", "NotifyFunction"]:
        props = none.function(name)
        assert "ReservedConcurrentExecutions" not in props, (name, props)
    env = none.function("DispatcherFunction")["Environment"]["Variables"]
    assert env["DISPATCHER_RESERVED_CONCURRENCY"] == "0"


@check
def the_callback_routes_exist_only_with_a_push_token():
    without = Stack({})
    assert without.function("WechatCallbackFunction") is None
    assert not any("/wechat/callback" in r for r in without.routes()), without.routes()
    assert "POST /v1/grants" in without.routes(), without.routes()
    with_push = Stack(PUSH)
    assert {"GET /wechat/callback", "POST /wechat/callback"} <= with_push.routes()
    env = with_push.function("WechatCallbackFunction")["Environment"]["Variables"]
    assert env["WECHAT_ORIGINAL_ID"] == "gh_123456789abc"
    assert env["WECHAT_PUSH_INSECURE_PLAIN"] == "false"
    perms = [
        p
        for p in with_push.of_type("AWS::Lambda::Permission").values()
        if "WechatCallback" in str(p["Properties"]["FunctionName"])
    ]
    assert perms, "API Gateway may invoke the callback"


@check
def combinations_that_cannot_work_are_refused():
    assert Stack(PUSH).rules_failed == []
    assert Stack({}).rules_failed == []
    no_id = dict(PUSH, WechatOriginalId="")
    assert Stack(no_id).rules_failed == ["PushNeedsOriginalId"]
    no_key = dict(PUSH, WechatPushAesKeySecretArn="")
    assert Stack(no_key).rules_failed == ["EncryptedPushNeedsItsKey"]
    plain = dict(PUSH, WechatPushMode="plain", WechatPushAesKeySecretArn="")
    assert Stack(plain).rules_failed == ["PlainPushIsAnExplicitOptIn"]
    assert Stack(dict(plain, WechatPushInsecurePlain="true")).rules_failed == []


@check
def a_dispatcher_reservation_too_small_for_its_workers_is_refused():
    params = {
        name: str(spec.get("Default", ""))
        for name, spec in template_yaml()["Parameters"].items()
    }
    low, high = (
        int(template_yaml()["Parameters"]["DispatchWorkers"][k]) for k in ("MinValue", "MaxValue")
    )
    refused = 0
    for workers in range(low, high + 1):
        for reserved in range(0, high + 10):
            failed = failed_rules(
                template_yaml(),
                dict(params, DispatchWorkers=str(workers), DispatcherConcurrency=str(reserved)),
            )
            fits = reserved == 0 or reserved >= workers + 2
            assert (failed == []) == fits, (workers, reserved, failed)
            if not fits:
                assert failed == ["DispatcherHasRoomForItsWorkers"], (workers, reserved, failed)
                refused += 1
    assert refused == sum(w + 1 for w in range(low, high + 1)), refused


@check
def the_table_is_protected():
    table = Stack({}).of_type("AWS::DynamoDB::Table")["Table"]
    assert table["Properties"]["DeletionProtectionEnabled"] is True
    assert table["Properties"]["PointInTimeRecoverySpecification"] == {
        "PointInTimeRecoveryEnabled": True
    }
    assert table["DeletionPolicy"] == "Retain"


def deploy_params(*args):
    """scripts/deploy-params' exit status, output and errors."""
    run = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "deploy-params"), *args],
        capture_output=True,
        text=True,
    )
    return run.returncode, run.stdout, run.stderr


def as_sam_cli_parses(argument):
    """`--parameter-overrides <argument>` as SAM CLI parses it."""
    return CfnParameterOverridesType().convert((argument,), None, None)


def environment_bytes(variables):
    """A function's environment as Lambda counts it (keys and values, UTF-8); a value
    only known at deploy time (a physical name, an ARN) counted as 100 bytes."""
    return sum(
        len(k.encode()) + (len(v.encode()) if isinstance(v, str) else 100)
        for k, v in variables.items()
    )


@check
def logs_expire_and_abuse_and_spend_are_alarmed():
    for params, callback in [({}, False), (PUSH, True)]:
        stack = Stack(dict(params, LogRetentionDays="30"))
        groups = stack.of_type("AWS::Logs::LogGroup")
        assert all(g["Properties"]["RetentionInDays"] == "30" for g in groups.values()), groups
        functions = stack.of_type("AWS::Lambda::Function")
        assert len(functions) == (11 if callback else 9), sorted(functions)
        for name, fn in functions.items():
            logging_config = fn["Properties"]["LoggingConfig"]
            assert logging_config["LogFormat"] == "JSON", name
            group = logging_config["LogGroup"]
            assert group.get("Ref") in groups, (name, group)
        api = next(iter(stack.of_type("AWS::ApiGatewayV2::Stage").values()))
        access = api["Properties"]["AccessLogSettings"]
        assert access["DestinationArn"] == {"Fn::GetAtt": ["ApiAccessLogGroup", "Arn"]}
        assert "$context.routeKey" in access["Format"] and "$context.status" in access["Format"]
        alarms = stack.of_type("AWS::CloudWatch::Alarm")
        wanted = {
            "RateLimitedAlarm", "ApiClientErrorsAlarm", "NotifyRefusedAlarm", "ThrottlesAlarm",
            "PublisherRefusalsAlarm", "NotifyConflictsAlarm", "OutcomesDeadAlarm",
        }
        assert wanted <= set(alarms), sorted(alarms)
        assert ("CallbackRefusedAlarm" in alarms) == callback
        throttled = alarms["ThrottlesAlarm"]["Properties"]["Metrics"]
        assert len(throttled) == (10 if callback else 9), throttled
    table = Stack({}).of_type("AWS::DynamoDB::Table")["Table"]["Properties"]
    assert "OnDemandThroughput" not in table
    capped = Stack({"TableMaxWriteUnits": "500"}).of_type("AWS::DynamoDB::Table")["Table"]
    assert capped["Properties"]["OnDemandThroughput"] == {"MaxWriteRequestUnits": "500"}


@check
def a_refused_secret_read_and_any_secret_write_alarm_when_a_trail_is_named():
    alarms = Stack(PUSH).of_type("AWS::CloudWatch::Alarm")
    assert not {"SecretReadRefusedAlarm", "SecretWritesAlarm"} & set(alarms)
    assert not Stack(PUSH).of_type("AWS::Logs::MetricFilter")
    stack = Stack(dict(PUSH, CloudTrailLogGroupName="aws-cloudtrail-logs-1234", AlarmTopicArn=TOPIC))
    filters = stack.of_type("AWS::Logs::MetricFilter")
    assert set(filters) == {"SecretReadRefusedFilter", "SecretWritesFilter"}, sorted(filters)
    for name, alarm_name in [("SecretReadRefusedFilter", "SecretReadRefusedAlarm"),
                             ("SecretWritesFilter", "SecretWritesAlarm")]:
        props = filters[name]["Properties"]
        assert props["LogGroupName"] == "aws-cloudtrail-logs-1234"
        (transform,) = props["MetricTransformations"]
        alarm = stack.of_type("AWS::CloudWatch::Alarm")[alarm_name]["Properties"]
        assert (alarm["Namespace"], alarm["MetricName"]) == (transform["MetricNamespace"], transform["MetricName"])
        assert alarm["Threshold"] == 1 and alarm["ComparisonOperator"] == "GreaterThanOrEqualToThreshold"
        assert alarm["AlarmActions"] == [TOPIC]
    pattern = filters["SecretReadRefusedFilter"]["Properties"]["FilterPattern"]
    assert len(pattern) <= 1024, len(pattern)
    for term in ['"secretsmanager.amazonaws.com"', '"GetSecretValue"', '"AccessDenied*"']:
        assert term in pattern, pattern
    # Every write action a fence denies is counted, unless the rotation's role made it;
    # a caller with no session issuer (a user, the root) is counted too.
    sub = filters["SecretWritesFilter"]["Properties"]["FilterPattern"]["Fn::Sub"]
    text, variables = sub
    assert len(text) + 200 <= 1024, len(text)  # (with the role's ARN put in)
    fence = next(
        st for st in stack.of_type("AWS::SecretsManager::ResourcePolicy")["SessionSecretPolicy"]
        ["Properties"]["ResourcePolicy"]["Statement"] if st["Sid"] == "OnlyItsOwnWriters"
    )
    for action in fence["Action"]:
        assert f'$.eventName = "{action.split(":")[1]}"' in text, action
    assert '($.userIdentity.sessionContext.sessionIssuer.arn NOT EXISTS)' in text, text
    assert '($.userIdentity.sessionContext.sessionIssuer.arn != "${Rotator}")' in text, text
    assert variables["Rotator"] == {"Fn::GetAtt": ["SessionKeyRotationFunctionRole", "Arn"]}
    unrotated = Stack(dict(PUSH, CloudTrailLogGroupName="trail", SessionKeyRotationDays="0"))
    _, variables = unrotated.of_type("AWS::Logs::MetricFilter")["SecretWritesFilter"]["Properties"]["FilterPattern"]["Fn::Sub"]
    assert variables["Rotator"] == "none", variables


def readers(policy):
    """The principals a secret's resource policy leaves able to read it."""
    statement = next(
        st for st in policy["Properties"]["ResourcePolicy"]["Statement"]
        if st["Sid"] == "OnlyTheFunctionsThatUseIt"
    )
    assert statement["Effect"] == "Deny" and statement["Principal"] == "*", statement
    assert statement["Action"] == "secretsmanager:GetSecretValue", statement
    allowed = statement["Condition"]["ArnNotEquals"]["aws:PrincipalArn"]
    return sorted(
        a["Fn::GetAtt"][0] if isinstance(a, dict) else a for a in allowed
    )


SECRET_WRITES = {
    "secretsmanager:PutSecretValue", "secretsmanager:UpdateSecret",
    "secretsmanager:UpdateSecretVersionStage", "secretsmanager:RotateSecret",
    "secretsmanager:CancelRotateSecret", "secretsmanager:RestoreSecret",
    "secretsmanager:DeleteSecret", "secretsmanager:ReplicateSecretToRegions",
    "secretsmanager:RemoveRegionsFromReplication", "secretsmanager:StopReplicationToReplica",
    "secretsmanager:PutResourcePolicy", "secretsmanager:DeleteResourcePolicy",
}


def writers(policy):
    """The principals a secret's resource policy leaves able to write it (besides
    CloudFormation), after checking its write fence denies every write to the rest."""
    (statement,) = [
        st for st in policy["Properties"]["ResourcePolicy"]["Statement"]
        if st["Sid"] == "OnlyItsOwnWriters"
    ]
    assert statement["Effect"] == "Deny" and statement["Principal"] == "*", statement
    assert set(statement["Action"]) == SECRET_WRITES, statement["Action"]
    condition = statement["Condition"]
    assert condition["ForAllValues:StringNotEquals"] == {
        "aws:CalledVia": ["cloudformation.amazonaws.com"]
    }, condition
    allowed = condition.get("ArnNotEquals", {}).get("aws:PrincipalArn", [])
    allowed = allowed if isinstance(allowed, list) else [allowed]
    return sorted(a["Fn::GetAtt"][0] if isinstance(a, dict) else a for a in allowed)


@check
def every_secret_is_fenced_against_writes_but_by_its_own_writers():
    glass = "arn:aws:iam::123456789012:role/ops-break-glass"
    names = [
        "SessionSecretPolicy", "WechatSecretPolicy", "PushTokenPolicy", "PushAesKeyPolicy",
        "PublishersSecretPolicy",
    ]
    plain = Stack(dict(PUSH, SessionKeyRotationDays="0")).of_type("AWS::SecretsManager::ResourcePolicy")
    for name in names:
        assert writers(plain[name]) == [], (name, "nobody but CloudFormation")
    with_glass = Stack(dict(PUSH, BreakGlassRoleArn=glass)).of_type("AWS::SecretsManager::ResourcePolicy")
    assert writers(with_glass["SessionSecretPolicy"]) == sorted(
        ["SessionKeyRotationFunctionRole", glass]
    )
    for name in names[1:]:
        assert writers(with_glass[name]) == [glass], name
    # The rotation function runs for the session key's rotation only.
    permission = Stack(PUSH).of_type("AWS::Lambda::Permission")["SessionKeyRotationPermission"]
    assert permission["Properties"]["SourceArn"] == {"Ref": "SessionSecret"}, permission


@check
def the_dead_letter_queue_is_written_by_its_writers_and_read_by_break_glass_only():
    glass = "arn:aws:iam::123456789012:role/ops-break-glass"
    for params, reader in [({}, None), ({"BreakGlassRoleArn": glass}, glass)]:
        policy = Stack(params).of_type("AWS::SQS::QueuePolicy")["NotifyDeadLetterQueuePolicy"]
        statements = {st.get("Sid", "allow"): st for st in policy["Properties"]["PolicyDocument"]["Statement"]}
        put = statements["OnlyItsWritersPut"]
        assert put["Effect"] == "Deny" and put["Action"] == "sqs:SendMessage", put
        assert put["Condition"]["ArnNotEquals"]["aws:PrincipalArn"] == {
            "Fn::GetAtt": ["NotifyFunctionRole", "Arn"]
        }
        assert put["Condition"]["StringNotEquals"]["aws:PrincipalServiceName"] == "events.amazonaws.com"
        read = statements["OnlyBreakGlassReads"]
        assert read["Effect"] == "Deny" and "sqs:ReceiveMessage" in read["Action"], read
        if reader:
            assert read["Condition"] == {"ArnNotEquals": {"aws:PrincipalArn": reader}}, read
        else:
            # Nobody: denied whatever the request.
            assert read["Condition"] == {"Bool": {"aws:SecureTransport": [True, False]}}, read
        change = statements["OnlyCloudFormationChangesIt"]
        assert "sqs:SetQueueAttributes" in change["Action"], change


CHINA = {
    "AWS::Region": "cn-north-1",
    "AWS::AccountId": "123456789012",
    "AWS::Partition": "aws-cn",
    "AWS::StackName": "onegrant",
    "AWS::URLSuffix": "amazonaws.com.cn",
}


class ChinaStack(Stack):
    """The stack as SAM transforms it in the aws-cn partition (cn-north-1)."""

    pseudo = CHINA

    def __init__(self, overrides):
        # The transform picks the partition of the region it runs in (as `sam deploy`
        # run against cn-north-1 does).
        from samtranslator.translator.arn_generator import ArnGenerator

        previous = ArnGenerator.BOTO_SESSION_REGION_NAME
        ArnGenerator.BOTO_SESSION_REGION_NAME = "cn-north-1"
        try:
            super().__init__(overrides)
        finally:
            ArnGenerator.BOTO_SESSION_REGION_NAME = previous


@check
def the_stack_transforms_for_the_china_partition_with_no_global_arn_and_either_processor():
    base = dict(
        PUSH,
        WechatSecretArn="arn:aws-cn:secretsmanager:cn-north-1:123456789012:secret:onegrant/app-AbCdEf",
        WechatPushTokenSecretArn="arn:aws-cn:secretsmanager:cn-north-1:123456789012:secret:onegrant/push-AbCdEf",
        WechatPushAesKeySecretArn="arn:aws-cn:secretsmanager:cn-north-1:123456789012:secret:onegrant/aes-AbCdEf",
        SecretsKmsKeyArn="arn:aws-cn:kms:cn-north-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab",
    )
    for architecture in ["arm64", "x86_64"]:
        stack = ChinaStack(dict(base, Architecture=architecture))
        functions = stack.of_type("AWS::Lambda::Function")
        assert functions, "the functions"
        for name, fn in functions.items():
            assert fn["Properties"]["Architectures"] == [architecture], (name, architecture)
        # Every ARN the stack writes itself follows the partition: no literal arn:aws:.
        text = json.dumps({n: stack.value(r) for n, r in stack.resources.items()})
        assert '"arn:aws:' not in text and "arn:aws:iam" not in text, [
            t for t in text.split('"') if t.startswith("arn:aws:")
        ][:5]
        # Secrets Manager's endpoint there is .amazonaws.com.cn.
        decrypt = [
            st for st in role_statements(stack, "SessionFunctionRole")
            if st.get("Action") == "kms:Decrypt"
        ]
        via = decrypt[0]["Condition"]["StringEquals"]["kms:ViaService"]
        assert via == {"Fn::Sub": "secretsmanager.${AWS::Region}.${AWS::URLSuffix}"}, via
    default = Stack({}).of_type("AWS::Lambda::Function")
    assert all(f["Properties"]["Architectures"] == ["arm64"] for f in default.values())


@check
def each_publisher_lane_pairs_a_source_with_its_accounts_only():
    assert Stack({}).of_type("AWS::Events::EventBusPolicy") == {}
    lanes = "com.example.shop=111122223333;444455556666,com.example.news=777788889999"
    stack = Stack({"PublisherLanes": lanes})
    policies = stack.of_type("AWS::Events::EventBusPolicy")
    assert sorted(policies) == ["NotifyBusLane0", "NotifyBusLane1"], sorted(policies)
    granted = []
    for policy in policies.values():
        statement = policy["Properties"]["Statement"]
        assert statement["Effect"] == "Allow" and statement["Action"] == "events:PutEvents"
        condition = statement["Condition"]["StringEquals"]
        assert condition["events:detail-type"] == ["onegrant.notification", "onegrant.cancel"]
        granted.append((condition["events:source"], statement["Principal"]["AWS"]))
    assert sorted(granted) == [
        ("com.example.news", ["777788889999"]),
        ("com.example.shop", ["111122223333", "444455556666"]),
    ], granted
    # notify checks each event's account against the same lanes.
    env = stack.function("NotifyFunction")["Environment"]["Variables"]
    assert env["PUBLISHER_LANES"] == lanes and env["STACK_ACCOUNT"] == "123456789012", env
    eight = ",".join(f"s{i}=1111222233{i:02d}" for i in range(8))
    assert len(Stack({"PublisherLanes": eight}).of_type("AWS::Events::EventBusPolicy")) == 8
    # The publisher API: three routes to its own function, which reads the keys' secret.
    routes = stack.routes()
    for route in [
        "POST /publisher/v1/notifications",
        "POST /publisher/v1/cancels",
        "GET /publisher/v1/notifications/{idempotency_key}",
    ]:
        assert route in routes, sorted(routes)
    env = stack.function("PublisherFunction")["Environment"]["Variables"]
    assert env["ONEGRANT_PUBLISHERS_ARN"] == {"Ref": "PublishersSecret"}, env
    # Outcomes go on the stack's bus, as onegrant's outcome events only.
    outcomes = stack.function("OutcomesFunction")
    assert outcomes["Environment"]["Variables"]["OUTCOME_BUS"] == {"Ref": "NotifyBus"}
    assert outcomes["ReservedConcurrentExecutions"] == 1, "one tick at a time"
    # (SAM turns the function's Policies into its role's inline policies.)
    role = stack.of_type("AWS::IAM::Role")["OutcomesFunctionRole"]["Properties"]
    puts = [
        st for policy in role.get("Policies", [])
        for st in policy["PolicyDocument"]["Statement"]
        if st.get("Action") == "events:PutEvents"
    ]
    assert len(puts) == 1, role
    assert puts[0]["Resource"] == {"Fn::GetAtt": ["NotifyBus", "Arn"]}, puts
    assert puts[0]["Condition"]["StringEquals"] == {
        "events:source": "onegrant", "events:detail-type": "onegrant.push.outcome"
    }, puts


@check
def each_secret_is_readable_only_by_the_functions_that_use_it():
    stack = Stack(PUSH)
    policies = stack.of_type("AWS::SecretsManager::ResourcePolicy")
    assert readers(policies["SessionSecretPolicy"]) == [
        "GrantsFunctionRole", "InboxFunctionRole", "RemindersFunctionRole", "SessionFunctionRole",
        "SessionKeyRotationFunctionRole",
    ]
    unrotated = Stack(dict(PUSH, SessionKeyRotationDays="0"))
    assert readers(unrotated.of_type("AWS::SecretsManager::ResourcePolicy")["SessionSecretPolicy"]) == [
        "GrantsFunctionRole", "InboxFunctionRole", "RemindersFunctionRole", "SessionFunctionRole"
    ]
    assert readers(policies["WechatSecretPolicy"]) == [
        "DispatcherFunctionRole", "SessionFunctionRole", "WechatIpsFunctionRole"
    ]
    # Without the push there is no callback, so nobody keeps WeChat's door.
    assert readers(Stack({}).of_type("AWS::SecretsManager::ResourcePolicy")["WechatSecretPolicy"]) == [
        "DispatcherFunctionRole", "SessionFunctionRole"
    ]
    assert readers(policies["PushTokenPolicy"]) == ["WechatCallbackFunctionRole"]
    assert readers(policies["PushAesKeyPolicy"]) == ["WechatCallbackFunctionRole"]
    assert readers(policies["PublishersSecretPolicy"]) == ["OutcomesFunctionRole", "PublisherFunctionRole"]
    assert policies["WechatSecretPolicy"]["Properties"]["SecretId"] == BASE["WechatSecretArn"]
    # The roles named are the ones SAM gives the functions.
    roles = stack.of_type("AWS::IAM::Role")
    for name in ["SessionFunctionRole", "DispatcherFunctionRole", "WechatCallbackFunctionRole"]:
        assert name in roles, sorted(roles)
    glass = "arn:aws:iam::123456789012:role/ops-break-glass"
    with_glass = Stack(dict(PUSH, BreakGlassRoleArn=glass))
    policy = with_glass.of_type("AWS::SecretsManager::ResourcePolicy")["SessionSecretPolicy"]
    assert glass in readers(policy)
    # A host's token issuer reads the session key and nothing else.
    issuer = "arn:aws:iam::123456789012:role/host-backend"
    hosted = Stack(dict(PUSH, SessionIssuerRoleArn=issuer)).of_type("AWS::SecretsManager::ResourcePolicy")
    assert issuer in readers(hosted["SessionSecretPolicy"])
    for other in ["WechatSecretPolicy", "PushTokenPolicy", "PushAesKeyPolicy"]:
        assert issuer not in readers(hosted[other]), other
    assert issuer not in readers(policies["SessionSecretPolicy"])
    unfenced = Stack(dict(PUSH, FenceExternalSecrets="false"))
    assert sorted(unfenced.of_type("AWS::SecretsManager::ResourcePolicy")) == [
        "PublishersSecretPolicy", "SessionSecretPolicy"
    ]
    without_push = Stack({})
    assert sorted(without_push.of_type("AWS::SecretsManager::ResourcePolicy")) == [
        "PublishersSecretPolicy", "SessionSecretPolicy", "WechatSecretPolicy"
    ]
    # A pending session key is trusted only while a rotation names it.
    env = stack.function("GrantsFunction")["Environment"]["Variables"]
    assert env["SESSION_SECRET_PENDING_VERSION"] == ""
    rotating = Stack(dict(PUSH, SessionKeyRotationVersion="0f1e2d3c-aaaa-4bbb-8ccc-1234567890ab"))
    env = rotating.function("InboxFunction")["Environment"]["Variables"]
    assert env["SESSION_SECRET_PENDING_VERSION"] == "0f1e2d3c-aaaa-4bbb-8ccc-1234567890ab"


def role_statements(stack, role):
    props = stack.of_type("AWS::IAM::Role")[role]["Properties"]
    return [st for p in props.get("Policies", []) for st in p["PolicyDocument"]["Statement"]]


@check
def a_customer_managed_key_is_usable_through_secrets_manager_only():
    key = "arn:aws:kms:us-east-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab"
    # The functions that read a secret the key can encrypt (the AppSecret, the push
    # secrets); no other holds a kms:Decrypt it would not use.
    readers = ["Session", "Dispatcher", "WechatCallback"]
    with_key = Stack(dict(PUSH, SecretsKmsKeyArn=key))
    for name in readers:
        decrypts = [
            st for st in role_statements(with_key, f"{name}FunctionRole")
            if st.get("Action") == "kms:Decrypt"
        ]
        assert len(decrypts) == 1, (name, decrypts)
        assert decrypts[0]["Resource"] == key
        via = decrypts[0]["Condition"]["StringEquals"]["kms:ViaService"]
        assert "secretsmanager" in str(via), via
    for name in ["Notify", "Grants", "Reminders", "Inbox", "Publisher", "Outcomes"]:
        assert not any(
            st.get("Action") == "kms:Decrypt"
            for st in role_statements(with_key, f"{name}FunctionRole")
        ), name
    without = Stack(PUSH)
    for name in readers:
        assert not any(
            st.get("Action") == "kms:Decrypt"
            for st in role_statements(without, f"{name}FunctionRole")
        ), name


@check
def the_documented_deploy_parameters_reach_the_functions_intact():
    templates = (ROOT / "config" / "local.templates.json").read_text()
    reminders = (ROOT / "config" / "local.reminders.json").read_text()
    # The old way, Templates="$(cat my-templates.json)": SAM CLI cuts it.
    cut = as_sam_cli_parses(f"WechatAppId=wx1 Templates={templates}")
    assert cut.get("Templates") != templates, "a raw JSON argument survived SAM CLI"
    # The documented way: scripts/deploy-params, then file://params.yaml.
    status, out, err = deploy_params(
        str(ROOT / "config" / "local.templates.json"),
        str(ROOT / "config" / "local.reminders.json"),
        "WechatAppId=wx1234567890abcdef",
        f"WechatSecretArn={BASE['WechatSecretArn']}",
        "NotifySources=com.example.shop,com.example.pay",
    )
    assert status == 0, err
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "params.yaml"
        path.write_text(out)
        parsed = as_sam_cli_parses(f"file://{path}")
    assert json.loads(parsed["Templates"]) == json.loads(templates)
    assert json.loads(parsed["Reminders"]) == json.loads(reminders)
    assert parsed["NotifySources"] == "com.example.shop,com.example.pay"
    stack = Stack(dict(parsed, **PUSH))
    functions = stack.of_type("AWS::Lambda::Function")
    assert len(functions) == 11, sorted(functions)
    for name, fn in functions.items():
        env = fn["Properties"]["Environment"]["Variables"]
        assert env["ONEGRANT_TEMPLATES"] == parsed["Templates"], name
        assert env["ONEGRANT_REMINDERS"] == parsed["Reminders"], name
        # What deploy-params leaves the other variables is enough for each function.
        others = {k: v for k, v in env.items() if not k.startswith("ONEGRANT_")}
        assert environment_bytes(others) <= 1200, (name, environment_bytes(others))


@check
def deploy_params_refuses_what_sam_cli_or_lambda_would_break():
    with tempfile.TemporaryDirectory() as tmp:
        quoted = Path(tmp) / "quoted.json"
        quoted.write_text(json.dumps([{"id": "t", "title": 'say "hi"', "keywords": []}]))
        status, _, err = deploy_params(str(quoted), str(quoted))
        assert status != 0 and "quotes" in err, err
        big = Path(tmp) / "big.json"
        big.write_text(json.dumps([{"id": f"t{i}", "title": "提醒" * 40} for i in range(20)]))
        status, _, err = deploy_params(str(big), str(big))
        assert status != 0 and "4 KB" in err, err
        broken = Path(tmp) / "broken.json"
        broken.write_text("[{")
        status, _, err = deploy_params(str(broken), str(broken))
        assert status != 0 and "not readable JSON" in err, err


@check
def deploy_params_refuses_to_drop_a_reminder_kind_unless_told():
    templates = str(ROOT / "config" / "local.templates.json")
    water = json.loads((ROOT / "config" / "local.reminders.json").read_text())
    with tempfile.TemporaryDirectory() as tmp:
        both = Path(tmp) / "both.json"
        both.write_text(json.dumps(water + [dict(water[0], kind="stretch")], ensure_ascii=False))
        only_water = Path(tmp) / "water.json"
        only_water.write_text(json.dumps(water, ensure_ascii=False))
        status, out, err = deploy_params(templates, str(both))
        assert status == 0, err
        previous = Path(tmp) / "params.yaml"
        previous.write_text(out)
        # Dropping stretch: refused, naming it; said out loud, written.
        status, out, err = deploy_params("--previous", str(previous), templates, str(only_water))
        assert status != 0 and "stretch" in err and "--drop-kind" in err and out == "", err
        status, out, err = deploy_params(
            "--previous", str(previous), "--drop-kind", "stretch", templates, str(only_water)
        )
        assert status == 0 and "Reminders:" in out, err
        # Keeping every kind (or adding one) needs nothing said.
        status, _, err = deploy_params("--previous", str(previous), templates, str(both))
        assert status == 0, err
        status, _, err = deploy_params("--previous", str(tmp) + "/none.yaml", templates, str(both))
        assert status != 0 and "not readable" in err, err


@check
def the_session_key_rotates_on_a_schedule_by_its_own_function():
    stack = Stack(PUSH)
    (schedule,) = stack.of_type("AWS::SecretsManager::RotationSchedule").values()
    props = schedule["Properties"]
    assert props["SecretId"] == {"Ref": "SessionSecret"}
    assert props["RotationLambdaARN"] == {"Fn::GetAtt": ["SessionKeyRotationFunction", "Arn"]}
    assert props["RotationRules"] == {"AutomaticallyAfterDays": "30"}
    assert props["RotateImmediatelyOnUpdate"] is False, "no rotation on every deploy"
    (permission,) = [
        p for p in stack.of_type("AWS::Lambda::Permission").values()
        if p["Properties"]["Principal"] == "secretsmanager.amazonaws.com"
    ]
    assert permission["Properties"]["SourceAccount"] == "123456789012"
    fn = stack.function("SessionKeyRotationFunction")
    assert fn["Environment"]["Variables"]["SESSION_SECRET_ARN"] == {"Ref": "SessionSecret"}
    statements = [
        st for st in role_statements(stack, "SessionKeyRotationFunctionRole")
        if any(str(a).startswith("secretsmanager:") for a in st.get("Action", []))
    ]
    assert len(statements) == 1, statements
    assert statements[0]["Resource"] == {"Ref": "SessionSecret"}, "the session key alone"
    assert sorted(statements[0]["Action"]) == [
        "secretsmanager:DescribeSecret", "secretsmanager:GetSecretValue",
        "secretsmanager:PutSecretValue", "secretsmanager:UpdateSecretVersionStage",
    ]
    alarm = stack.of_type("AWS::CloudWatch::Alarm")["SessionKeyRotationErrorsAlarm"]["Properties"]
    assert alarm["Dimensions"] == [{"Name": "FunctionName", "Value": {"Ref": "SessionKeyRotationFunction"}}]
    off = Stack(dict(PUSH, SessionKeyRotationDays="0"))
    assert "SessionKeyRotationErrorsAlarm" not in off.of_type("AWS::CloudWatch::Alarm")
    assert not off.of_type("AWS::SecretsManager::RotationSchedule")
    assert off.function("SessionKeyRotationFunction") is None


EDGE_ACL = (
    "arn:aws:wafv2:us-east-1:123456789012:global/webacl/onegrant-edge/"
    "1234abcd-12ab-34cd-56ef-1234567890ab"
)
EDGE_IP_SET = "arn:aws:wafv2:us-east-1:123456789012:global/ipset/onegrant-edge-wechat/0f1e2d3c"
HTTP_FUNCTIONS = ["Session", "Grants", "Reminders", "Inbox", "WechatCallback"]


def reads_origin_secret(stack, name):
    def resources(statement):
        found = statement.get("Resource", [])
        return found if isinstance(found, list) else [found]

    return any(
        {"Ref": "OriginSecret"} in resources(st)
        for st in role_statements(stack, f"{name}FunctionRole")
    )


@check
def the_edge_protection_fronts_the_api_and_closes_its_own_address():
    header = next(
        line.split('"')[1]
        for line in (ROOT / "shared" / "src" / "http" / "mod.rs").read_text().splitlines()
        if line.startswith("pub const ORIGIN_HEADER")
    )
    without = Stack(PUSH)
    assert not without.of_type("AWS::CloudFront::Distribution")
    assert "OriginSecret" not in without.of_type("AWS::SecretsManager::Secret")
    for name in HTTP_FUNCTIONS:
        env = without.function(f"{name}Function")["Environment"]["Variables"]
        assert env["ORIGIN_SECRET_ARN"] == "", name
        assert not reads_origin_secret(without, name), name
    # The edge on CloudFront's own name accepts TLS 1.0 (its default certificate):
    # refused unless told so.
    assert Stack(dict(PUSH, EdgeWebAclArn=EDGE_ACL, EdgeWechatIpSetArn=EDGE_IP_SET)).rules_failed == ["EdgeServesTls12OrIsToldItDoesNot"]
    stack = Stack(dict(PUSH, EdgeWebAclArn=EDGE_ACL, EdgeWechatIpSetArn=EDGE_IP_SET, EdgeInsecureDefaultCertificate="true"))
    assert stack.rules_failed == []
    assert "OriginSecret" in stack.of_type("AWS::SecretsManager::Secret")
    (dist,) = stack.of_type("AWS::CloudFront::Distribution").values()
    config = dist["Properties"]["DistributionConfig"]
    assert config["WebACLId"] == EDGE_ACL
    (origin,) = config["Origins"]
    assert "${Api}.execute-api." in origin["DomainName"]["Fn::Sub"], origin
    assert origin["CustomOriginConfig"]["OriginProtocolPolicy"] == "https-only"
    (added,) = origin["OriginCustomHeaders"]
    assert added["HeaderName"] == header, (added, header)
    assert "{{resolve:secretsmanager:${OriginSecret}" in added["HeaderValue"]["Fn::Sub"]
    behavior = config["DefaultCacheBehavior"]
    assert behavior["TargetOriginId"] == origin["Id"]
    assert behavior["ViewerProtocolPolicy"] == "https-only"
    assert {"GET", "PUT", "POST", "DELETE"} <= set(behavior["AllowedMethods"])
    # Managed-CachingDisabled and Managed-AllViewerExceptHostHeader.
    assert behavior["CachePolicyId"] == "4135ea2d-6df8-44a3-9df3-4b5a84be39ad"
    assert behavior["OriginRequestPolicyId"] == "b689b0a8-53d0-40ab-baf2-68738e2966ac"
    assert config["IPV6Enabled"] is False, "per-IP limits need IPv4"
    counting = Stack(dict(PUSH, EdgeWebAclArn=EDGE_ACL, EdgeWechatIpSetArn=EDGE_IP_SET, EdgeInsecureDefaultCertificate="true",
                          EdgeOriginCheck="count"))
    for name in HTTP_FUNCTIONS:
        assert stack.function(f"{name}Function")["Environment"]["Variables"]["ORIGIN_CHECK"] == "enforce"
        env = counting.function(f"{name}Function")["Environment"]["Variables"]
        assert env["ORIGIN_CHECK"] == "count", name
    for name in HTTP_FUNCTIONS:
        env = stack.function(f"{name}Function")["Environment"]["Variables"]
        assert env["ORIGIN_SECRET_ARN"] == {"Ref": "OriginSecret"}, name
        assert reads_origin_secret(stack, name), name
    for name in ["Dispatcher", "Notify"]:
        env = stack.function(f"{name}Function")["Environment"]["Variables"]
        assert "ORIGIN_SECRET_ARN" not in env, name
        assert not reads_origin_secret(stack, name), name
    assert "Aliases" not in config and "ViewerCertificate" not in config, config
    cert = "arn:aws:acm:us-east-1:123456789012:certificate/1234abcd-12ab-34cd-56ef-1234567890ab"
    domain = dict(PUSH, EdgeWebAclArn=EDGE_ACL, EdgeWechatIpSetArn=EDGE_IP_SET, EdgeDomainName="api.example.cn")
    assert Stack(domain).rules_failed == ["EdgeDomainNeedsTheEdgeAndACertificate"]
    assert Stack(dict(domain, EdgeInsecureDefaultCertificate="true")).rules_failed == [
        "EdgeDomainNeedsTheEdgeAndACertificate"]
    no_edge = dict(PUSH, EdgeDomainName="api.example.cn", EdgeCertificateArn=cert)
    assert Stack(no_edge).rules_failed == ["EdgeDomainNeedsTheEdgeAndACertificate"]
    named = Stack(dict(domain, EdgeCertificateArn=cert))
    assert named.rules_failed == []
    (dist,) = named.of_type("AWS::CloudFront::Distribution").values()
    config = dist["Properties"]["DistributionConfig"]
    assert config["Aliases"] == ["api.example.cn"]
    viewer = config["ViewerCertificate"]
    assert (viewer["AcmCertificateArn"], viewer["SslSupportMethod"]) == (cert, "sni-only")
    # TLS 1.2 at least wherever the edge answers on a name a mini-program can call.
    assert viewer["MinimumProtocolVersion"] == "TLSv1.2_2021", viewer


@check
def the_edge_web_acl_limits_each_address_with_the_callback_looser():
    template = yaml_parse((ROOT / "edge" / "waf.yaml").read_text())
    params = template["Parameters"]
    acl = template["Resources"]["WebAcl"]["Properties"]
    assert acl["Scope"] == {"Ref": "Scope"} and params["Scope"]["Default"] == "CLOUDFRONT"
    assert acl["DefaultAction"] == {"Allow": {}}
    rules = {r["Name"]: r for r in acl["Rules"]}
    assert sorted(rules) == [
        "api-per-ip", "body-over-64-kib", "callback-only-from-wechat", "callback-per-ip",
        "known-bad-inputs", "session-per-ip",
    ], sorted(rules)
    # WeChat's door, first: the callback from anywhere but WeChat's IP set is refused.
    door = rules.pop("callback-only-from-wechat")
    assert door["Priority"] == min(r["Priority"] for r in acl["Rules"])
    blocking = EdgeStack({}).of_type("AWS::WAFv2::WebACL")["WebAcl"]["Properties"]["Rules"][0]
    assert blocking["Name"] == "callback-only-from-wechat"
    assert blocking["Action"]["Block"]["CustomResponse"]["ResponseCode"] == 403, "blocks by default"
    counting = EdgeStack({"WechatDoor": "count"}).of_type("AWS::WAFv2::WebACL")["WebAcl"]["Properties"]["Rules"][0]
    assert counting["Action"] == {"Count": {}}, "an upgrade counts first"
    path, outside = door["Statement"]["AndStatement"]["Statements"]
    assert path["RegexMatchStatement"]["RegexString"] == "/wechat/callback/*$", path
    assert outside["NotStatement"]["Statement"]["IPSetReferenceStatement"]["Arn"] == {
        "Fn::GetAtt": ["WechatIpSet", "Arn"]}
    ip_set = template["Resources"]["WechatIpSet"]["Properties"]
    assert (ip_set["Scope"], ip_set["IPAddressVersion"]) == ({"Ref": "Scope"}, "IPV4"), ip_set
    assert template["Outputs"]["WechatIpSetArn"]["Value"] == {"Fn::GetAtt": ["WechatIpSet", "Arn"]}
    # A body over the API's limit is refused at the edge: inspected up to 64 KB, and a
    # larger one counted as over.
    size = rules.pop("body-over-64-kib")
    constraint = size["Statement"]["SizeConstraintStatement"]
    assert constraint["FieldToMatch"] == {"Body": {"OversizeHandling": "MATCH"}}, constraint
    assert (constraint["ComparisonOperator"], constraint["Size"]) == ("GT", 65536), constraint
    assert size["Action"]["Block"]["CustomResponse"]["ResponseCode"] == 413
    assert EdgeStack({}).of_type("AWS::WAFv2::WebACL")["WebAcl"]["Properties"]["AssociationConfig"][
        "RequestBody"] == {"CLOUDFRONT": {"DefaultSizeInspectionLimit": "KB_64"}}
    managed = rules.pop("known-bad-inputs")
    group = managed["Statement"]["ManagedRuleGroupStatement"]
    assert (group["VendorName"], group["Name"]) == ("AWS", "AWSManagedRulesKnownBadInputsRuleSet")
    assert managed["OverrideAction"] == {"None": {}}, "the group's own actions: block"
    priorities = [r["Priority"] for r in acl["Rules"]]
    assert len(set(priorities)) == len(priorities), priorities
    paths = {}
    for name, rule in rules.items():
        rate = rule["Statement"]["RateBasedStatement"]
        assert rate["AggregateKeyType"] == "IP", name
        response = rule["Action"]["Block"]["CustomResponse"]
        assert response["ResponseCode"] == 429, name
        assert {"Name": "Retry-After", "Value": "60"} in response["ResponseHeaders"], name
        scope = rate["ScopeDownStatement"]
        negated = "NotStatement" in scope
        match = (scope["NotStatement"]["Statement"] if negated else scope)["RegexMatchStatement"]
        paths[name] = (negated, match["RegexString"])
        # Matched as API Gateway routes it: decoded, then normalised.
        kinds = [t["Type"] for t in sorted(match["TextTransformations"], key=lambda t: t["Priority"])]
        assert kinds == ["URL_DECODE", "NORMALIZE_PATH"], (name, kinds)
        limit = params[rate["Limit"]["Ref"]]
        assert limit["MinValue"] >= 10, name
    # A path's end, trailing slashes too (API Gateway routes /x/ as /x); the regional
    # front's default address puts the stage first.
    assert paths["callback-per-ip"] == (False, "/wechat/callback/*$")
    assert paths["session-per-ip"] == (False, "/v1/session/*$")
    assert paths["api-per-ip"] == (True, "/wechat/callback/*$")
    import re
    for regex, path, hit in [
        ("/wechat/callback/*$", "/wechat/callback", True),
        ("/wechat/callback/*$", "/wechat/callback/", True),
        ("/wechat/callback/*$", "/api/wechat/callback//", True),
        ("/wechat/callback/*$", "/wechat/callbacks", False),
        ("/v1/session/*$", "/api/v1/session/", True),
        ("/v1/session/*$", "/v1/sessions", False),
    ]:
        assert bool(re.search(regex, path)) == hit, (regex, path)
    default = {
        name: params[r["Statement"]["RateBasedStatement"]["Limit"]["Ref"]]["Default"]
        for name, r in rules.items()
    }
    assert default["callback-per-ip"] > default["api-per-ip"] > default["session-per-ip"], default
    assert template["Outputs"]["WebAclArn"]["Value"] == {"Fn::GetAtt": ["WebAcl", "Arn"]}


@check
def wechats_door_is_kept_hourly_throttled_apart_and_open_only_to_wechat():
    stack = Stack(PUSH)
    fn = stack.function("WechatIpsFunction")
    assert fn["Environment"]["Variables"]["WECHAT_IP_SET"] == ""
    assert "WECHAT_SECRET_ARN" in fn["Environment"]["Variables"]
    (rule,) = [r for r in stack.of_type("AWS::Events::Rule").values()
               if r["Properties"]["Targets"][0]["Arn"] == {"Fn::GetAtt": ["WechatIpsFunction", "Arn"]}]
    assert rule["Properties"]["ScheduleExpression"] == "rate(1 hour)"
    statements = role_statements(stack, "WechatIpsFunctionRole")
    actions = sorted(a for st in statements for a in ([st["Action"]] if isinstance(st["Action"], str) else st["Action"]))
    assert actions == ["dynamodb:PutItem", "secretsmanager:GetSecretValue"], actions
    put = next(st for st in statements if st["Action"] == "dynamodb:PutItem")
    assert put["Condition"] == {"ForAllValues:StringEquals": {"dynamodb:LeadingKeys": ["WECHAT#IPS"]}}
    callback = stack.function("WechatCallbackFunction")["Environment"]["Variables"]
    assert callback["WECHAT_IPS_CHECK"] == "on"
    assert Stack(dict(PUSH, WechatIpsCheck="off")).function("WechatCallbackFunction")["Environment"]["Variables"]["WECHAT_IPS_CHECK"] == "off"
    # Its own throttle, on both methods; without the push, only the login's.
    (api,) = stack.of_type("AWS::ApiGatewayV2::Stage").values()
    routes = api["Properties"]["RouteSettings"]
    for route in ["POST /wechat/callback", "GET /wechat/callback"]:
        assert routes[route] == {"ThrottlingRateLimit": "100", "ThrottlingBurstLimit": "100"}, routes
    assert routes["POST /v1/session"]["ThrottlingRateLimit"] == "20"
    (plain,) = Stack({}).of_type("AWS::ApiGatewayV2::Stage").values()
    assert sorted(plain["Properties"]["RouteSettings"]) == ["POST /v1/session"]
    assert "WechatIpsFunction" not in Stack({}).of_type("AWS::Lambda::Function")
    # With the edge and its IP set: the function keeps that set, and only it.
    ip_set = "arn:aws:wafv2:us-east-1:123456789012:global/ipset/onegrant-edge-wechat/0f1e2d3c"
    edged = Stack(dict(PUSH, EdgeWebAclArn=EDGE_ACL, EdgeInsecureDefaultCertificate="true",
                       EdgeWechatIpSetArn=ip_set))
    # The front's door needs its IP set (or no push ever gets through), and the set a front.
    assert Stack(dict(PUSH, EdgeWebAclArn=EDGE_ACL, EdgeInsecureDefaultCertificate="true")).rules_failed == [
        "WechatsDoorAtTheFrontHasItsIpSet"]
    assert Stack(dict(PUSH, RegionalFront="true")).rules_failed == ["WechatsDoorAtTheFrontHasItsIpSet"]
    # Moving a running stack to a front: while the check only counts, pushes come
    # around it (their addresses checked by the callback) until the set exists.
    assert Stack(dict(PUSH, RegionalFront="true", EdgeOriginCheck="count")).rules_failed == []
    assert Stack(dict(PUSH, EdgeWechatIpSetArn=ip_set)).rules_failed == ["WechatIpSetNeedsAFront"]
    # Without the push there is no callback to guard.
    assert Stack(dict(EdgeWebAclArn=EDGE_ACL, EdgeInsecureDefaultCertificate="true")).rules_failed == []
    # Failed runs are not retried: the alarm counts runs.
    invoke = stack.of_type("AWS::Lambda::EventInvokeConfig")["WechatIpsFunctionEventInvokeConfig"]
    assert invoke["Properties"]["MaximumRetryAttempts"] == 0, invoke
    assert edged.function("WechatIpsFunction")["Environment"]["Variables"]["WECHAT_IP_SET"] == ip_set
    waf = [st for st in role_statements(edged, "WechatIpsFunctionRole") if "wafv2:UpdateIPSet" in st["Action"]]
    assert waf == [{"Effect": "Allow", "Action": ["wafv2:GetIPSet", "wafv2:UpdateIPSet"], "Resource": ip_set}], waf
    alarm = stack.of_type("AWS::CloudWatch::Alarm")["WechatIpsFailedAlarm"]["Properties"]
    assert alarm["Dimensions"] == [{"Name": "FunctionName", "Value": {"Ref": "WechatIpsFunction"}}]


class EdgeStack(Stack):
    """edge/waf.yaml (plain CloudFormation) with one parameter set, conditions resolved."""

    def __init__(self, overrides, pseudo=PSEUDO):
        self.pseudo = pseudo
        template = yaml_parse((ROOT / "edge" / "waf.yaml").read_text())
        params = {n: str(spec.get("Default", "")) for n, spec in template["Parameters"].items()}
        params.update(overrides)
        self.params = params
        self.rules_failed = failed_rules(template, params, pseudo)
        self.conditions = {}
        self.raw_conditions = template.get("Conditions", {})
        self.resources = {
            name: res
            for name, res in template["Resources"].items()
            if "Condition" not in res or self.condition(res["Condition"])
        }
        self.outputs = {
            name: out
            for name, out in template["Outputs"].items()
            if "Condition" not in out or self.condition(out["Condition"])
        }


@check
def the_regional_front_guards_a_rest_api_in_either_partition_and_passes_all_to_the_http_api():
    secret = "arn:aws-cn:secretsmanager:cn-north-1:123456789012:secret:OriginSecret-AbCdEf"
    cloudfront = EdgeStack({})
    assert cloudfront.rules_failed == []
    assert not cloudfront.of_type("AWS::ApiGateway::RestApi") and "FrontUrl" not in cloudfront.outputs
    # Outside us-east-1 only the regional scope (the China regions' only WAF).
    assert EdgeStack({}, CHINA).rules_failed == ["CloudFrontScopeLivesInUsEast1"]
    assert EdgeStack({"Scope": "REGIONAL"}, CHINA).rules_failed == ["RegionalFrontNeedsTheApiAndItsOriginSecret"]
    # Its own domain, TLS 1.2 at least, the default address closed; without one only
    # when told (the default address's TLS policy cannot be set).
    cert = "arn:aws-cn:acm:cn-north-1:123456789012:certificate/1234abcd-12ab-34cd-56ef-1234567890ab"
    regional = {"Scope": "REGIONAL", "ApiId": "a1b2c3d4e5", "OriginSecretArn": secret}
    assert EdgeStack(regional, CHINA).rules_failed == ["RegionalFrontNeedsTheApiAndItsOriginSecret"]
    assert EdgeStack(dict(regional, FrontDomainName="api.example.cn"), CHINA).rules_failed == [
        "FrontDomainHasItsCertificate"]
    named = EdgeStack(dict(regional, FrontDomainName="api.example.cn", FrontCertificateArn=cert), CHINA)
    assert named.rules_failed == []
    (domain,) = named.of_type("AWS::ApiGateway::DomainName").values()
    assert domain["Properties"]["SecurityPolicy"] == "TLS_1_2"
    assert domain["Properties"]["EndpointConfiguration"] == {"Types": ["REGIONAL"]}
    assert named.of_type("AWS::ApiGateway::RestApi")["FrontApi"]["Properties"]["DisableExecuteApiEndpoint"] is True
    assert named.of_type("AWS::ApiGateway::BasePathMapping"), "the domain mapped to the front"
    assert EdgeStack(dict(PUSH, FrontDomainName="api.example.cn", FrontCertificateArn=cert)).rules_failed == [
        "FrontDomainHasItsCertificate"]
    front = EdgeStack(dict(regional, FrontInsecureDefaultEndpoint="true"), CHINA)
    assert front.rules_failed == []
    assert not front.of_type("AWS::ApiGateway::DomainName")
    assert front.of_type("AWS::ApiGateway::RestApi")["FrontApi"]["Properties"]["DisableExecuteApiEndpoint"] is False
    (api,) = front.of_type("AWS::ApiGateway::RestApi").values()
    assert api["Properties"]["EndpointConfiguration"]["Types"] == ["REGIONAL"]
    (method,) = front.of_type("AWS::ApiGateway::Method").values()
    assert method["Properties"]["HttpMethod"] == "ANY"
    integration = method["Properties"]["Integration"]
    assert integration["Type"] == "HTTP_PROXY"
    assert integration["Uri"] == {"Fn::Sub": "https://${ApiId}.execute-api.${AWS::Region}.${AWS::URLSuffix}/{proxy}"}
    header = integration["RequestParameters"]["integration.request.header.x-onegrant-origin"]
    assert header == {"Fn::Sub": "'{{resolve:secretsmanager:${OriginSecretArn}:SecretString}}'"}, header
    (acl,) = front.of_type("AWS::WAFv2::WebACL").values()
    assert acl["Properties"]["Scope"] == "REGIONAL"
    assert acl["Properties"]["AssociationConfig"]["RequestBody"] == {"API_GATEWAY": {"DefaultSizeInspectionLimit": "KB_64"}}
    (ip_set,) = front.of_type("AWS::WAFv2::IPSet").values()
    assert ip_set["Properties"]["Scope"] == "REGIONAL"
    (association,) = front.of_type("AWS::WAFv2::WebACLAssociation").values()
    arn = association["Properties"]["ResourceArn"]["Fn::Sub"]
    assert arn.startswith("arn:${AWS::Partition}:apigateway:${AWS::Region}::/restapis/"), arn
    # Nothing the partition decides is written out: no arn:aws: literal, no .amazonaws.com host.
    raw = (ROOT / "edge" / "waf.yaml").read_text()
    assert "arn:aws:" not in raw.replace("arn:aws[a-z-]*:", "") and "amazonaws.com" not in raw
    # Its rules match a path's end (the default address puts the stage first).
    for rule in acl["Properties"]["Rules"]:
        assert not list(json_find(rule, "ByteMatchStatement")), rule["Name"]
        for match in json_find(rule, "RegexMatchStatement"):
            assert match["RegexString"].endswith("/*$"), rule["Name"]
    # The onegrant stack behind it: the origin secret made and checked, its ARN and
    # the API's id given out, the wechat-ips function keeping the regional IP set.
    ip_set_arn = "arn:aws-cn:wafv2:cn-north-1:123456789012:regional/ipset/onegrant-front-wechat/0f1e"
    behind = ChinaStack(dict(PUSH, RegionalFront="true", EdgeWechatIpSetArn=ip_set_arn))
    assert behind.rules_failed == []
    assert "OriginSecret" in behind.of_type("AWS::SecretsManager::Secret")
    assert not behind.of_type("AWS::CloudFront::Distribution")
    for name in HTTP_FUNCTIONS:
        assert behind.function(f"{name}Function")["Environment"]["Variables"]["ORIGIN_SECRET_ARN"] == {"Ref": "OriginSecret"}
    assert behind.function("WechatIpsFunction")["Environment"]["Variables"]["WECHAT_IP_SET"] == ip_set_arn
    both = Stack(dict(PUSH, RegionalFront="true", EdgeWebAclArn=EDGE_ACL, EdgeWechatIpSetArn=EDGE_IP_SET,
                      EdgeInsecureDefaultCertificate="true"))
    assert both.rules_failed == ["OneFront"]


def json_find(node, key):
    """Every value under `key`, anywhere in `node`."""
    if isinstance(node, dict):
        for k, v in node.items():
            if k == key:
                yield v
            yield from json_find(v, key)
    elif isinstance(node, list):
        for v in node:
            yield from json_find(v, key)


def main():
    failed = 0
    for fn in CHECKS:
        try:
            fn()
            print(f"ok   {fn.__name__}")
        except AssertionError as e:
            failed += 1
            print(f"FAIL {fn.__name__}: {e!r}")
    if failed:
        sys.exit(f"template-test: {failed} of {len(CHECKS)} failed")
    print(f"template-test: {len(CHECKS)} checks passed")


if __name__ == "__main__":
    main()
