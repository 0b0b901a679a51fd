//! Test support shared by the state layer's unit tests.

/// Runs `f` to completion on a fresh current-thread runtime with timers and I/O enabled.
pub fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a current-thread runtime builds")
        .block_on(f)
}
