//! The slow dependency: a real local TCP service with injected latency, and its client.
//!
//! Protocol: one line `GET <sku>\n` per request, answered `<sku> <stock>\n` after the
//! configured latency. Each client call is a `tracing` span (`inventory.lookup`, kind
//! client), a child of the request's span.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tracing::Instrument;

/// Starts the dependency on `127.0.0.1:0` with `latency` per request; returns its address.
pub async fn serve(latency: Duration) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(handle(stream, latency));
        }
    });
    Ok(addr)
}

async fn handle(stream: TcpStream, latency: Duration) {
    let (read, mut write) = stream.into_split();
    let mut lines = BufReader::new(read).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        tokio::time::sleep(latency).await;
        let sku = line.strip_prefix("GET ").unwrap_or("?");
        let stock = sku.bytes().map(u64::from).sum::<u64>() % 100;
        if write
            .write_all(format!("{sku} {stock}\n").as_bytes())
            .await
            .is_err()
        {
            return;
        }
    }
}

/// Looks up one SKU's stock.
pub async fn lookup(addr: SocketAddr, sku: &str) -> std::io::Result<u64> {
    let span = tracing::info_span!("inventory.lookup", otel.kind = "client", sku);
    async {
        let stream = TcpStream::connect(addr).await?;
        let (read, mut write) = stream.into_split();
        write.write_all(format!("GET {sku}\n").as_bytes()).await?;
        let mut line = String::new();
        BufReader::new(read).read_line(&mut line).await?;
        line.split_whitespace()
            .nth(1)
            .and_then(|n| n.parse().ok())
            .ok_or_else(|| std::io::Error::other(format!("bad inventory answer {line:?}")))
    }
    .instrument(span)
    .await
}
