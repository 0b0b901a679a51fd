//! A TCP proxy a test owns, to cut a process off from a service (the broker) and bring it back
//! without touching the shared service: [`TcpProxy::cut`] closes every connection and refuses
//! new ones, [`TcpProxy::restore`] accepts again.

use std::net::SocketAddr;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;

/// A proxy from `listen` to `upstream` (see the module).
#[derive(Debug)]
pub struct TcpProxy {
    listen: SocketAddr,
    upstream: SocketAddr,
    /// The accept loop and every connection's copy task; dropped (aborted) by [`TcpProxy::cut`].
    running: Option<tokio::task::JoinHandle<()>>,
}

impl TcpProxy {
    /// Starts forwarding `listen` to `upstream`.
    ///
    /// # Errors
    /// When `listen` cannot be bound.
    pub async fn start(listen: SocketAddr, upstream: SocketAddr) -> anyhow::Result<Self> {
        let mut proxy = Self {
            listen,
            upstream,
            running: None,
        };
        proxy.restore().await?;
        Ok(proxy)
    }

    /// Closes every connection and stops listening: clients see resets, then refusals.
    pub async fn cut(&mut self) {
        if let Some(running) = self.running.take() {
            running.abort();
            let _ = running.await;
        }
    }

    /// Listens and forwards again (no-op while running).
    ///
    /// # Errors
    /// When the address cannot be bound again.
    pub async fn restore(&mut self) -> anyhow::Result<()> {
        if self.running.is_some() {
            return Ok(());
        }
        let listener = TcpListener::bind(self.listen).await?;
        let upstream = self.upstream;
        self.running = Some(tokio::spawn(async move {
            // Aborting the accept loop drops this set, which aborts every connection.
            let mut connections = JoinSet::new();
            loop {
                tokio::select! {
                    accepted = listener.accept() => {
                        let Ok((mut client, _)) = accepted else { continue };
                        connections.spawn(async move {
                            if let Ok(mut server) = TcpStream::connect(upstream).await {
                                let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                            }
                        });
                    }
                    Some(_) = connections.join_next(), if !connections.is_empty() => {}
                }
            }
        }));
        Ok(())
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        if let Some(running) = self.running.take() {
            running.abort();
        }
    }
}
