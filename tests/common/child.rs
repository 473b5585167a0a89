//! The `kakehi` binary run as a child process: a loopback port for its HTTP
//! API, its tip as that API reports it, and a graceful stop (SIGTERM).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, ExitStatus};
use std::time::{Duration, Instant};

/// A loopback port that was free a moment ago.
pub fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

/// `GET path` on the HTTP API at `127.0.0.1:port`: the JSON body of a 200,
/// or `None` while nothing answers there (not started yet, killed).
pub fn http_json(port: u16, path: &str) -> Option<serde_json::Value> {
    let mut s = TcpStream::connect_timeout(
        &SocketAddr::from(([127, 0, 0, 1], port)),
        Duration::from_secs(1),
    )
    .ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).ok()?;
    let text = String::from_utf8_lossy(&buf);
    let (head, body) = text.split_once("\r\n\r\n")?;
    if !head.starts_with("HTTP/1.1 200") {
        return None;
    }
    serde_json::from_str(body).ok()
}

/// The node's (height, tip hash) from `/rest/chaininfo.json`.
pub fn http_tip(port: u16) -> Option<(u64, String)> {
    let v = http_json(port, "/rest/chaininfo.json")?;
    Some((
        v["blocks"].as_u64()?,
        v["bestblockhash"].as_str()?.to_owned(),
    ))
}

/// Sends SIGTERM to `child`.
pub fn sigterm(child: &Child) {
    let ok = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill -TERM");
    assert!(ok.success(), "kill -TERM {}", child.id());
}

/// SIGTERM, then waits up to `timeout` for the exit: its status, or
/// `None` (the child then killed) if it did not stop in time.
pub fn stop(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    sigterm(child);
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(s) = child.try_wait().expect("wait") {
            return Some(s);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
