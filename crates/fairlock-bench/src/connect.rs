//! Making the Redis backend: the one place that knows how `fairlock-redis` is configured.

use std::sync::Arc;

use fairlock::{BoxError, LockBackend};
use fairlock_redis::RedisBackend;

/// How to build a backend; `Default` is what a user gets out of the box.
#[derive(Clone, Debug, Default)]
pub(crate) struct Options {
    /// Connections in the command pool (`None`: the backend's default).
    pub(crate) pool_size: Option<usize>,
    /// How long an idle lock's fence hash stays (`None`: the backend's default).
    pub(crate) fence_margin: Option<std::time::Duration>,
}

pub(crate) async fn backend(url: &str, options: Options) -> Result<Arc<dyn LockBackend>, BoxError> {
    let mut builder = RedisBackend::builder(url);
    if let Some(size) = options.pool_size {
        builder = builder.pool_size(size);
    }
    if let Some(margin) = options.fence_margin {
        builder = builder.fence_margin(margin);
    }
    Ok(Arc::new(builder.connect().await?))
}
