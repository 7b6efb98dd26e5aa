//! Secrets from Secrets Manager at a cold start, through the same signed requests a
//! deployed function makes (the emulator serves Secrets Manager too): each secret given
//! by ARN is read, the session key's previous version keeps its tokens valid, and a
//! function missing a secret it uses fails its cold start naming it, never its value.

use std::collections::HashMap;

use aws_credential_types::Credentials;
use onegrant::config::{Config, ConfigError, Need};
use onegrant::domain::ids::OpenId;
use onegrant::secrets::SecretsReader;
use onegrant::session::Sessions;
use onegrant_tests::emulator_endpoint;
use serde_json::{Value, json};

fn reader() -> SecretsReader {
    SecretsReader::new(
        "us-east-1".into(),
        Credentials::new("local", "local", None, None, "tests"),
        emulator_endpoint().to_string(),
    )
}

/// Creates a secret named `name` (unique per test run) with `value`; its ARN.
async fn create(name: &str, value: &str) -> String {
    let name = format!("{name}-{}", uuid::Uuid::new_v4().simple());
    let body = json!({"Name": name, "SecretString": value}).to_string();
    let answer = reader()
        .call("TEST", "secretsmanager.CreateSecret", &body)
        .await
        .expect("emulator reachable");
    assert_eq!(answer.status().as_u16(), 200, "CreateSecret");
    let created: Value = answer.json().await.expect("JSON");
    created["ARN"].as_str().expect("ARN").to_string()
}

/// One Secrets Manager call the test makes as an operator would; its answer.
async fn operate(target: &str, body: Value) -> Value {
    let answer = reader()
        .call("TEST", target, &body.to_string())
        .await
        .expect("emulator reachable");
    assert_eq!(answer.status().as_u16(), 200, "{target}");
    answer.json().await.expect("JSON")
}

/// The rotation of docs/deployment.md: the new value staged AWSPENDING, then made AWSCURRENT (the old
/// one becomes AWSPREVIOUS) and no longer pending. Between the two, `between` runs with the staged version's id.
async fn rotate<F: std::future::Future<Output = ()>>(
    arn: &str,
    value: &str,
    between: impl FnOnce(String) -> F,
) -> String {
    let staged = operate(
        "secretsmanager.PutSecretValue",
        json!({"SecretId": arn, "SecretString": value, "VersionStages": ["AWSPENDING"]}),
    )
    .await;
    let version = staged["VersionId"]
        .as_str()
        .expect("a version id")
        .to_string();
    between(version.clone()).await;
    let current = operate("secretsmanager.DescribeSecret", json!({"SecretId": arn})).await;
    let old = current["VersionIdsToStages"]
        .as_object()
        .and_then(|v| {
            v.iter().find(|(_, stages)| {
                stages
                    .as_array()
                    .is_some_and(|s| s.contains(&json!("AWSCURRENT")))
            })
        })
        .map(|(id, _)| id.clone())
        .expect("a current version");
    operate(
        "secretsmanager.UpdateSecretVersionStage",
        json!({"SecretId": arn, "VersionStage": "AWSCURRENT",
               "MoveToVersionId": staged["VersionId"], "RemoveFromVersionId": old}),
    )
    .await;
    operate(
        "secretsmanager.UpdateSecretVersionStage",
        json!({"SecretId": arn, "VersionStage": "AWSPENDING",
               "RemoveFromVersionId": staged["VersionId"]}),
    )
    .await;
    version
}

fn environment(extra: &[(&'static str, &str)]) -> HashMap<&'static str, String> {
    let mut env: HashMap<&'static str, String> = HashMap::from([
        ("TABLE_NAME", "t".to_string()),
        ("WECHAT_APPID", "wx0000000000000000".to_string()),
        (
            "ONEGRANT_TEMPLATES",
            onegrant_local::stack::LOCAL_TEMPLATES.to_string(),
        ),
        (
            "ONEGRANT_REMINDERS",
            onegrant_local::stack::LOCAL_REMINDERS.to_string(),
        ),
        ("AWS_REGION", "us-east-1".to_string()),
        ("AWS_ACCESS_KEY_ID", "local".to_string()),
        ("AWS_SECRET_ACCESS_KEY", "local".to_string()),
        ("AWS_SESSION_TOKEN", "local-session".to_string()),
        (
            "AWS_ENDPOINT_URL_SECRETS_MANAGER",
            emulator_endpoint().to_string(),
        ),
    ]);
    for (k, v) in extra {
        env.insert(k, v.to_string());
    }
    env
}

async fn load(env: &HashMap<&'static str, String>) -> Result<Config, ConfigError> {
    Config::load_from(|name| env.get(name).cloned()).await
}

/// A container's key ring, as its cold start reads it from the session key's secret.
async fn container(env: &HashMap<&'static str, String>) -> Sessions {
    let config = load(env).await.expect("secrets read");
    assert!(config.session.source.is_some(), "read from Secrets Manager");
    Sessions::new(&config.session).expect("keys")
}

#[tokio::test]
async fn a_container_started_before_a_rotation_takes_tokens_signed_after_it_with_no_deploy() {
    onegrant::aws::install_crypto_provider();
    let (old_key, new_key, third) = ("p".repeat(40), "q".repeat(40), "r".repeat(40));
    let arn = create("session-reread", &old_key).await;
    let env = environment(&[("SESSION_SECRET_ARN", &arn)]);
    let openid = OpenId::parse("oReread").expect("openid");
    let now = onegrant::Clock::real_now();
    // Two containers' key rings, each with its own reader: one cold-started before the
    // rotation, one after.
    let before = container(&env).await;
    let old_token = before.issue(&openid, now).await.expect("signed").token;
    // The rotation's end (as its function's last step, or put-secret-value): the new
    // key current, the old one previous.
    operate(
        "secretsmanager.PutSecretValue",
        json!({"SecretId": arn, "SecretString": new_key}),
    )
    .await;
    let after = container(&env).await;
    let new_token = after.issue(&openid, now).await.expect("signed").token;
    // The new container takes the old container's tokens (the previous key) ...
    assert_eq!(
        after.verify(&old_token).await.expect("previous key"),
        openid
    );
    // ... and the old container, meeting a key it does not hold, reads the keys again
    // at once and takes the new container's: nobody is signed out, nothing redeployed.
    assert_eq!(before.verify(&new_token).await.expect("read again"), openid);
    // From then on it signs with the new key, which a ring of the new key alone takes.
    let resigned = before.issue(&openid, now).await.expect("signed").token;
    // (With the deployment's session lifetime: a token lasting longer is refused.)
    let ttl = load(&env).await.expect("secrets read").session.ttl;
    let only_new = Sessions::new(&onegrant::config::SessionConfig {
        secret: Some(onegrant::secrets::Secret::new(new_key.clone())),
        previous: None,
        pending: None,
        ttl,
        source: None,
    })
    .expect("keys");
    assert_eq!(only_new.verify(&resigned).await.expect("new key"), openid);
    // A token of a key it does not hold makes it read again at most once every
    // UNKNOWN_KEY_PAUSE (30 s): a third key minutes later would be read, one now is not.
    operate(
        "secretsmanager.PutSecretValue",
        json!({"SecretId": arn, "SecretString": third}),
    )
    .await;
    let third_token = container(&env)
        .await
        .issue(&openid, now)
        .await
        .expect("signed")
        .token;
    assert!(
        before.verify(&third_token).await.is_err(),
        "read again too soon"
    );
    // A key too short to have been made for signing, left previous by a mistaken put,
    // is not trusted by a container that reads the keys again (a cold start refuses it).
    let late = container(&env).await;
    operate(
        "secretsmanager.PutSecretValue",
        json!({"SecretId": arn, "SecretString": "tiny"}),
    )
    .await;
    let fourth = "t".repeat(40);
    operate(
        "secretsmanager.PutSecretValue",
        json!({"SecretId": arn, "SecretString": fourth}),
    )
    .await;
    let fourth_token = Sessions::new(&onegrant::config::SessionConfig {
        secret: Some(onegrant::secrets::Secret::new(fourth.clone())),
        previous: None,
        pending: None,
        ttl: std::time::Duration::from_secs(600),
        source: None,
    })
    .expect("keys")
    .issue(&openid, now)
    .await
    .expect("signed")
    .token;
    let tiny_token = {
        use jsonwebtoken::{EncodingKey, Header};
        let claims = json!({"sub": "oForged", "iat": now.timestamp(),
                            "exp": now.timestamp() + 600, "iss": "onegrant"});
        jsonwebtoken::encode(
            &Header::default(),
            &claims,
            &EncodingKey::from_secret(b"tiny").expect("key"),
        )
        .expect("signed")
    };
    assert_eq!(
        late.verify(&fourth_token).await.expect("read again"),
        openid
    );
    assert!(
        late.verify(&tiny_token).await.is_err(),
        "a short previous key"
    );
    // A ring given its keys directly has nothing to read again.
    assert!(only_new.verify(&old_token).await.is_err());
}

#[tokio::test]
async fn an_origin_secret_given_by_arn_but_empty_fails_the_cold_start() {
    onegrant::aws::install_crypto_provider();
    let session = create("session-origin", &"s".repeat(40)).await;
    let empty = create("origin-empty", "").await;
    let env = environment(&[
        ("SESSION_SECRET_ARN", &session),
        ("ORIGIN_SECRET_ARN", &empty),
    ]);
    // (The emulator keeps no string for an empty value: either way the cold start fails
    // naming the secret, and the check is never silently off.)
    let err = load(&env).await.expect_err("an empty origin secret");
    let chain = onegrant::telemetry::error_chain(&err);
    assert!(chain.contains("ORIGIN_SECRET"), "{chain}");
    let long = create("origin-long", &"o".repeat(64)).await;
    let env = environment(&[
        ("SESSION_SECRET_ARN", &session),
        ("ORIGIN_SECRET_ARN", &long),
    ]);
    let config = load(&env).await.expect("read");
    assert_eq!(config.origin.map(|o| o.expose().len()), Some(64));
}

/// The secret's versions and their stages.
async fn stages_of(arn: &str) -> HashMap<String, Vec<String>> {
    let described = operate("secretsmanager.DescribeSecret", json!({"SecretId": arn})).await;
    serde_json::from_value(described["VersionIdsToStages"].clone()).expect("stages")
}

#[tokio::test]
async fn the_rotation_functions_four_steps_make_a_new_key_current_and_nobody_is_signed_out() {
    use onegrant::secrets::rotation::{RotationError, RotationRequest, Step, rotate, sealed};
    onegrant::aws::install_crypto_provider();
    let old_key = "s".repeat(40);
    let arn = create("session-rotated", &old_key).await;
    let env = environment(&[("SESSION_SECRET_ARN", &arn)]);
    let openid = OpenId::parse("oRotated").expect("openid");
    let now = onegrant::Clock::real_now();
    let before = container(&env).await;
    let old_token = before.issue(&openid, now).await.expect("signed").token;
    let reader = reader();
    let token = uuid::Uuid::new_v4().to_string();
    let step = |step| RotationRequest {
        secret_id: arn.clone(),
        token: token.clone(),
        step,
    };
    // createSecret twice (Secrets Manager retries a step): one staged key.
    rotate(&reader, &arn, &step(Step::Create))
        .await
        .expect("create");
    let staged = |stages: &HashMap<String, Vec<String>>| stages.get(&token).cloned();
    assert_eq!(
        staged(&stages_of(&arn).await),
        Some(vec!["AWSPENDING".to_string()])
    );
    let value = |stage: &'static str| {
        let reader = &reader;
        let arn = &arn;
        async move {
            reader
                .read("SESSION_SECRET", arn, stage, None)
                .await
                .expect("read")
                .map(|s| s.expose().to_string())
        }
    };
    let first = value("AWSPENDING").await.expect("staged");
    rotate(&reader, &arn, &step(Step::Create))
        .await
        .expect("create again");
    assert_eq!(value("AWSPENDING").await, Some(first.clone()), "made once");
    assert_eq!(first.len(), 96, "32 random bytes and a 16-byte seal, hex");
    assert!(first.chars().all(|c| c.is_ascii_hexdigit()) && first != old_key);
    assert!(
        sealed(&old_key, &token, &first),
        "sealed under the key in use"
    );
    // Nothing changes for a token until it is current.
    assert_eq!(value("AWSCURRENT").await, Some(old_key.clone()));
    for s in [Step::Set, Step::Test, Step::Finish] {
        rotate(&reader, &arn, &step(s)).await.expect("step");
    }
    let stages = stages_of(&arn).await;
    assert!(
        staged(&stages).is_some_and(|s| s.contains(&"AWSCURRENT".to_string())),
        "{stages:?}"
    );
    assert_eq!(value("AWSCURRENT").await, Some(first.clone()));
    assert_eq!(value("AWSPREVIOUS").await, Some(old_key.clone()));
    // A step of a rotation already finished changes nothing.
    rotate(&reader, &arn, &step(Step::Finish))
        .await
        .expect("finished");
    assert_eq!(value("AWSCURRENT").await, Some(first.clone()));
    // Nobody is signed out: both containers take both keys' tokens.
    let after = container(&env).await;
    let new_token = after.issue(&openid, now).await.expect("signed").token;
    assert_eq!(after.verify(&old_token).await.expect("previous"), openid);
    assert_eq!(before.verify(&new_token).await.expect("read again"), openid);
    // Refused: another secret; a step for a version nobody staged.
    let other = RotationRequest {
        secret_id: format!("{arn}-other"),
        ..step(Step::Create)
    };
    assert!(matches!(
        rotate(&reader, &arn, &other).await,
        Err(RotationError::OtherSecret)
    ));
    let unstaged = RotationRequest {
        token: uuid::Uuid::new_v4().to_string(),
        ..step(Step::Finish)
    };
    assert!(matches!(
        rotate(&reader, &arn, &unstaged).await,
        Err(RotationError::NotStaged)
    ));
    assert_eq!(
        value("AWSCURRENT").await,
        Some(first.clone()),
        "nothing moved"
    );
    // A pending key the rotation did not make (someone past the write fence staged
    // one under the next rotation's token): every step refuses it, nothing moves.
    let foreign_token = uuid::Uuid::new_v4().to_string();
    // (A key's length, 96 hex characters: refused for its seal, not its shape.)
    let planted = "f".repeat(96);
    operate(
        "secretsmanager.PutSecretValue",
        json!({"SecretId": arn, "ClientRequestToken": foreign_token,
               "SecretString": planted, "VersionStages": ["AWSPENDING"]}),
    )
    .await;
    for s in [Step::Create, Step::Test, Step::Finish] {
        let planted_step = RotationRequest {
            token: foreign_token.clone(),
            ..step(s)
        };
        assert!(
            matches!(
                rotate(&reader, &arn, &planted_step).await,
                Err(RotationError::Foreign)
            ),
            "{s:?}"
        );
    }
    assert_eq!(
        value("AWSCURRENT").await,
        Some(first),
        "the key in use stays"
    );
    assert_eq!(
        stages_of(&arn).await.get(&foreign_token),
        Some(&vec!["AWSPENDING".to_string()]),
        "never made current"
    );
}

#[tokio::test]
async fn each_function_reads_only_its_secrets_by_arn_and_a_rotation_signs_nobody_out() {
    onegrant::aws::install_crypto_provider();
    let (old_key, new_key) = ("o".repeat(40), "n".repeat(40));
    let session_arn = create("session", &old_key).await;
    let app_arn = create("app", "app-secret-value").await;
    let openid = OpenId::parse("oUser1").expect("openid");

    // Before the rotation: the session function signs with the key it read.
    let session_env = environment(&[
        ("SESSION_SECRET_ARN", &session_arn),
        ("WECHAT_SECRET_ARN", &app_arn),
    ]);
    let before = load(&session_env).await.expect("secrets read");
    before
        .require(&[Need::SessionKey, Need::AppSecret])
        .expect("both");
    assert_eq!(
        before.wechat.secret.as_ref().map(|s| s.expose()),
        Some("app-secret-value")
    );
    assert!(
        before.session.previous.is_none(),
        "never rotated: no previous key"
    );
    let old_token = Sessions::new(&before.session)
        .expect("keys")
        .issue(&openid, onegrant::Clock::real_now())
        .await
        .expect("signed")
        .token;

    // Staged first: a verifier's cold start then accepts tokens of the new key before
    // the session function signs with it — only while the rotation is named (its
    // version id); an AWSPENDING key nobody named is never trusted. Then made current.
    let inbox_env = environment(&[("SESSION_SECRET_ARN", &session_arn)]);
    let named = |version: &str| {
        let mut env = inbox_env.clone();
        env.insert("SESSION_SECRET_PENDING_VERSION", version.to_string());
        env
    };
    let (inbox, named, new, old, id, token) =
        (&inbox_env, &named, &new_key, &old_key, &openid, &old_token);
    let version = rotate(&session_arn, &new_key, |version| async move {
        let (inbox_env, named, new_key, old_key, openid, old_token) =
            (inbox, named, new, old, id, token);
        let unnamed = load(inbox_env).await.expect("secrets read");
        assert!(
            unnamed.session.pending.is_none(),
            "a pending key is read only for a named rotation"
        );
        let other = load(&named("00000000-0000-4000-8000-000000000000"))
            .await
            .expect("secrets read");
        assert!(other.session.pending.is_none(), "another version is not it");
        let staged = load(&named(&version)).await.expect("secrets read");
        assert_eq!(
            staged.session.secret.as_ref().map(|s| s.expose()),
            Some(old_key.as_str())
        );
        assert_eq!(
            staged.session.pending.as_ref().map(|s| s.expose()),
            Some(new_key.as_str())
        );
        let mut signer = staged.session.clone();
        signer.secret = staged.session.pending.clone();
        let early = Sessions::new(&signer)
            .expect("keys")
            .issue(openid, onegrant::Clock::real_now())
            .await
            .expect("signed")
            .token;
        let verifier = Sessions::new(&staged.session).expect("keys");
        assert_eq!(verifier.verify(&early).await.expect("pending key"), *openid);
        assert_eq!(
            verifier.verify(old_token).await.expect("current key"),
            *openid
        );
        let unnamed = Sessions::new(&unnamed.session).expect("keys");
        assert!(
            unnamed.verify(&early).await.is_err(),
            "a token of an unnamed pending key"
        );
    })
    .await;
    // Once current, the named version is no longer pending: nothing is read for it.
    let finished = load(&named(&version)).await.expect("secrets read");
    assert!(finished.session.pending.is_none());
    // After it: a cold start reads both versions; old tokens still verify.
    let after = load(&inbox_env).await.expect("secrets read");
    assert_eq!(
        after.session.secret.as_ref().map(|s| s.expose()),
        Some(new_key.as_str())
    );
    assert_eq!(
        after.session.previous.as_ref().map(|s| s.expose()),
        Some(old_key.as_str())
    );
    let sessions = Sessions::new(&after.session).expect("keys");
    assert_eq!(
        sessions.verify(&old_token).await.expect("previous key"),
        openid
    );

    // The inbox function holds no AppSecret: its cold start passes with its own needs
    // and would fail with the session function's, naming the variable.
    after.require(&[Need::SessionKey]).expect("inbox needs");
    assert!(
        after.wechat.secret.is_none(),
        "no AppSecret where WeChat is not called"
    );
    let missing = after
        .require(&[Need::SessionKey, Need::AppSecret])
        .expect_err("missing");
    assert_eq!(missing.to_string(), "WECHAT_SECRET is required");

    // Refusals name what is wrong and never carry a secret's value.
    let unknown = "arn:aws:secretsmanager:us-east-1:123456789012:secret:nope-AbCdEf";
    let cases: Vec<(&str, HashMap<&'static str, String>)> = vec![
        (
            "a secret that does not exist",
            environment(&[("SESSION_SECRET_ARN", unknown)]),
        ),
        (
            "a secret both by value and by ARN",
            environment(&[
                ("SESSION_SECRET_ARN", &session_arn),
                ("SESSION_SECRET", &old_key),
            ]),
        ),
        ("no credentials to read it with", {
            let mut env = environment(&[("WECHAT_SECRET_ARN", &app_arn)]);
            env.remove("AWS_ACCESS_KEY_ID");
            env
        }),
    ];
    for (case, env) in cases {
        let err = load(&env).await.expect_err(case);
        let chain = onegrant::telemetry::error_chain(&err);
        for value in [old_key.as_str(), new_key.as_str(), "app-secret-value"] {
            assert!(!chain.contains(value), "{case}: {chain}");
        }
        assert!(
            chain.contains("SESSION_SECRET") || chain.contains("AWS_ACCESS_KEY_ID"),
            "{case}: {chain}"
        );
    }
}
