//! The `wechat-callback` Lambda: builds its dependencies once, then serves WeChat's
//! message pushes from API Gateway (without the push Token it answers 503).

#[tokio::main]
async fn main() -> Result<(), lambda_http::Error> {
    onegrant::http::run("wechat-callback", wechat_callback::handler, &[]).await
}
