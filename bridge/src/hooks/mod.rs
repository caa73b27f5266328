//! The span hooks: where spans start, are entered and exited, and end. They resolve each
//! span's local root once, write it into the thread's span record at every root
//! transition, and put the profile id and the CPU evidence on spans.

#[cfg(feature = "axum")]
pub mod axum;
pub(crate) mod evidence;
pub(crate) mod layer;
pub(crate) mod local_root;
pub(crate) mod otel_scope;
pub(crate) mod processor;
