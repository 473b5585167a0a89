//! A plain HTTP/1.1 `GET` on loopback for the benchmarks (included with
//! `#[path]`): one request per connection, the whole answer read.

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::time::Instant;

/// `GET path` from `addr` on a new connection: (status, body, milliseconds
/// from connect to the answer's last byte).
///
/// # Panics
/// When the connection fails or the answer is not HTTP.
pub fn get(addr: SocketAddr, path: &str) -> (u16, Vec<u8>, f64) {
    let t = Instant::now();
    let mut s = std::net::TcpStream::connect(addr).expect("connect");
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .expect("write");
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).expect("read");
    let ms = t.elapsed().as_secs_f64() * 1e3;
    let split = buf.windows(4).position(|w| w == b"\r\n\r\n").expect("head");
    let status = String::from_utf8_lossy(&buf[9..12])
        .parse()
        .expect("status");
    (status, buf[split + 4..].to_vec(), ms)
}
