//! A link the soak owns between the hosts and a service (the broker, the S3 server): a TCP
//! proxy that injects what a network does to a connection — added latency, a cut, a half-open
//! connection, a bandwidth cap — and, in front of an HTTP service, answers `503 Slow Down`.
//! Every connection watches the link's fault, so a change reaches open connections at once.

use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// What a link does to its connections now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkFault {
    /// Forwards as it comes.
    Healthy,
    /// Each chunk waits this long before it is forwarded, each way.
    Latency(Duration),
    /// Every connection is closed and new ones are refused (closed once accepted).
    Cut,
    /// Connections stay open, but nothing goes through either way (a peer gone silent);
    /// new ones are accepted and held the same.
    HalfOpen,
    /// Each way carries at most this many bytes a second.
    Bandwidth(u64),
    /// An HTTP service overloaded: open connections close, new ones are answered
    /// `503 Slow Down` and closed.
    Http503,
}

/// The largest chunk forwarded at once, bytes.
const CHUNK_BYTES: usize = 16 << 10;

/// A running link (module docs); stops when dropped.
#[derive(Debug)]
pub struct Link {
    listen: SocketAddr,
    fault: watch::Sender<LinkFault>,
    accept: JoinHandle<()>,
}

impl Link {
    /// A link on `listen` (port 0: any free one) to `upstream`, healthy.
    ///
    /// # Errors
    /// When `listen` cannot be bound.
    pub async fn start(listen: SocketAddr, upstream: SocketAddr) -> anyhow::Result<Self> {
        let listener = TcpListener::bind(listen).await?;
        let listen = listener.local_addr()?;
        let (fault, watching) = watch::channel(LinkFault::Healthy);
        let accept = tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    // Out of descriptors, say: try again in a moment rather than spin.
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                };
                let _ = client.set_nodelay(true);
                tokio::spawn(connection(client, upstream, watching.clone()));
            }
        });
        Ok(Self {
            listen,
            fault,
            accept,
        })
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.listen
    }

    /// Makes the link do `fault` from now on, to open connections too.
    pub fn set(&self, fault: LinkFault) {
        self.fault.send_replace(fault);
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        self.accept.abort();
        // Open connections see the channel close and end.
        self.fault.send_replace(LinkFault::Cut);
    }
}

/// One client connection: refused, answered 503, held, or forwarded both ways.
async fn connection(
    mut client: TcpStream,
    upstream: SocketAddr,
    mut fault: watch::Receiver<LinkFault>,
) {
    loop {
        let now = *fault.borrow_and_update();
        match now {
            LinkFault::Cut => return,
            LinkFault::Http503 => {
                answer_503(&mut client).await;
                return;
            }
            LinkFault::HalfOpen => {
                // Held until the link heals (or is cut): the client waits on its timeouts.
                if fault.changed().await.is_err() {
                    return;
                }
            }
            _ => break,
        }
    }
    let Ok(server) = TcpStream::connect(upstream).await else {
        return;
    };
    let _ = server.set_nodelay(true);
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    tokio::select! {
        () = pump(client_read, server_write, fault.clone()) => {}
        () = pump(server_read, client_write, fault) => {}
    }
}

/// Reads a request's head, answers `503 Slow Down` and closes, reading what the client still
/// sends for a moment (a body): closed with unread bytes, the socket would be reset, and the
/// client would see a broken connection, not the status.
async fn answer_503(client: &mut TcpStream) {
    const HEAD_MAX: usize = 64 << 10;
    let mut buf = [0u8; 4096];
    let mut head = Vec::new();
    let read_head = async {
        while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < HEAD_MAX {
            match client.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => head.extend_from_slice(&buf[..n]),
            }
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(5), read_head).await;
    let answer = b"HTTP/1.1 503 Slow Down\r\ncontent-length: 0\r\nconnection: close\r\n\r\n";
    if client.write_all(answer).await.is_err() || client.shutdown().await.is_err() {
        return;
    }
    let drain = async { while matches!(client.read(&mut buf).await, Ok(n) if n > 0) {} };
    let _ = tokio::time::timeout(Duration::from_secs(1), drain).await;
}

/// Forwards one way until either side closes or the link is cut.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut fault: watch::Receiver<LinkFault>,
) {
    let mut buf = vec![0u8; CHUNK_BYTES];
    loop {
        let read = tokio::select! {
            read = from.read(&mut buf) => read,
            changed = fault.changed() => {
                if changed.is_err() || matches!(*fault.borrow(), LinkFault::Cut | LinkFault::Http503) {
                    return;
                }
                continue;
            }
        };
        let n = match read {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        // What the link does to this chunk, as it is now (and again after a half-open spell).
        loop {
            let now = *fault.borrow_and_update();
            match now {
                LinkFault::Cut | LinkFault::Http503 => return,
                LinkFault::HalfOpen => {
                    if fault.changed().await.is_err() {
                        return;
                    }
                    continue;
                }
                LinkFault::Latency(delay) => tokio::time::sleep(delay).await,
                LinkFault::Bandwidth(bytes_per_second) => {
                    let secs = n as f64 / bytes_per_second.max(1) as f64;
                    tokio::time::sleep(Duration::from_secs_f64(secs)).await;
                }
                LinkFault::Healthy => {}
            }
            break;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An echo server; returns its address.
    async fn echo() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("binds");
        let addr = listener.local_addr().expect("bound");
        tokio::spawn(async move {
            loop {
                let Ok((mut socket, _)) = listener.accept().await else {
                    return;
                };
                tokio::spawn(async move {
                    let (mut r, mut w) = socket.split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                });
            }
        });
        addr
    }

    async fn round_trip(stream: &mut TcpStream) -> std::io::Result<Vec<u8>> {
        stream.write_all(b"ping").await?;
        let mut got = [0u8; 4];
        stream.read_exact(&mut got).await?;
        Ok(got.to_vec())
    }

    #[tokio::test]
    async fn a_link_forwards_and_its_faults_reach_open_connections() {
        let link = Link::start("127.0.0.1:0".parse().expect("addr"), echo().await)
            .await
            .expect("starts");
        let mut open = TcpStream::connect(link.addr()).await.expect("connects");
        assert_eq!(round_trip(&mut open).await.expect("echoed"), b"ping");
        // Half-open: the bytes go nowhere, the connection stays.
        link.set(LinkFault::HalfOpen);
        open.write_all(b"ping").await.expect("written");
        let mut got = [0u8; 4];
        let silent =
            tokio::time::timeout(Duration::from_millis(200), open.read_exact(&mut got)).await;
        assert!(silent.is_err(), "nothing comes back while half-open");
        // Healed: what waited goes through.
        link.set(LinkFault::Healthy);
        open.read_exact(&mut got).await.expect("echoed after");
        assert_eq!(&got, b"ping");
        // Cut: the open connection ends, a new one is closed at once.
        link.set(LinkFault::Cut);
        let mut end = [0u8; 1];
        assert_eq!(open.read(&mut end).await.unwrap_or(0), 0, "closed");
        let mut again = TcpStream::connect(link.addr()).await.expect("accepted");
        assert!(round_trip(&mut again).await.is_err(), "refused");
        // An HTTP service's 503.
        link.set(LinkFault::Http503);
        let mut http = TcpStream::connect(link.addr()).await.expect("accepted");
        http.write_all(b"PUT /bucket/key HTTP/1.1\r\ncontent-length: 4\r\n\r\nbody")
            .await
            .expect("sent");
        let mut answer = String::new();
        http.read_to_string(&mut answer).await.expect("answered");
        assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    }
}
