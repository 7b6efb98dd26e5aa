//! WeChat's message push (`/wechat/callback`): each subscription event recorded once
//! (`record`), then applied in WeChat's order (`apply`): popup and change events move
//! grants and plans, sent events settle sends.

mod apply;
mod record;

pub use record::{APPLY_GRACE, NONCE_MEMORY, PushKey, PushRecorded};
