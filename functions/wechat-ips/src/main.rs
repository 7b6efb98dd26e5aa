//! The `wechat-ips` Lambda: an EventBridge schedule invokes it every hour; each
//! invocation reads WeChat's push addresses and keeps them where WeChat's door is kept.

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    onegrant::events::run(
        "wechat-ips",
        wechat_ips::invoke,
        &[onegrant::config::Need::AppSecret],
    )
    .await
}
