//! HTTP requests as a client sends them (method, path, query, body),
//! against the whole router (every route, the limits, CORS and error
//! layers) over a node that imported testnet-data/regtest-a: must never
//! panic, and never answer 500 (an internal error) however malformed the
//! path, query or body.
//!
//! Input: byte 0 picks the method (even: GET, odd: POST), then the request
//! target (`/path?query`) up to the first newline, then the body.
//! Seeds: `fuzz/seeds/http_requests/` (one request per route).
#![no_main]

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, OnceLock};

use axum::body::Body;
use axum::http::{Request, StatusCode};
use bitcoin::Network;
use kakehi::chain::ChainParams;
use kakehi::http::{router, AppState};
use kakehi::import::import_files;
use kakehi::node::{open_chainstate, DataDir};
use libfuzzer_sys::fuzz_target;
use tower::ServiceExt;

struct Fixture {
    runtime: tokio::runtime::Runtime,
    router: axum::Router,
    _dir: tempfile::TempDir,
}

fn fixture() -> &'static Fixture {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        let dir = tempfile::tempdir().expect("tempdir");
        let datadir = DataDir::open(dir.path()).expect("datadir");
        let chain = parking_lot::Mutex::new(
            open_chainstate(ChainParams::new(Network::Regtest), &datadir).expect("chainstate"),
        );
        let blocks = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../testnet-data/regtest-a/blocks.dat");
        import_files(&chain, &[blocks], &AtomicBool::new(false), false).expect("import");
        let state = AppState {
            snapshots: chain.lock().snapshots(),
            p2p: None,
        };
        // The chain state stays alive with its snapshots' handles.
        std::mem::forget(Arc::new(chain));
        Fixture {
            runtime: tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime"),
            router: router(state),
            _dir: dir,
        }
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    let (target, body) = match rest.iter().position(|b| *b == b'\n') {
        Some(i) => (&rest[..i], &rest[i + 1..]),
        None => (rest, &[][..]),
    };
    let method = if selector & 1 == 0 { "GET" } else { "POST" };
    let Ok(request) = Request::builder()
        .method(method)
        .uri(target)
        .header("content-type", "application/json")
        .body(Body::from(body.to_vec()))
    else {
        return; // not a URI any HTTP server would have parsed
    };
    let f = fixture();
    let response = f
        .runtime
        .block_on(f.router.clone().oneshot(request))
        .expect("the router is infallible");
    assert_ne!(
        response.status(),
        StatusCode::INTERNAL_SERVER_ERROR,
        "{method} {}",
        String::from_utf8_lossy(target)
    );
});
