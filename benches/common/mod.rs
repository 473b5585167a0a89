//! Helpers shared by the benchmarks (included with `#[path]`): sizes on
//! disk, the process's resident memory and CPU time.

use std::path::Path;

/// Bytes of every file under `dir`, recursively (0 if it cannot be read).
pub fn dir_bytes(dir: &Path) -> u64 {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return 0;
    };
    rd.flatten()
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => dir_bytes(&e.path()),
            Ok(m) => m.len(),
            Err(_) => 0,
        })
        .sum()
}

/// A field of `/proc/self/status` in MiB (`VmRSS:` now, `VmHWM:` the peak);
/// 0 where it cannot be read (not Linux).
pub fn status_mib(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb / 1024)
}

/// CPU time (user + system, all threads) of this process in seconds, from
/// /proc/self/stat (clock ticks, assumed 100 per second as on Linux x86-64);
/// 0 where it cannot be read.
#[allow(dead_code)] // not every bench that includes this file reads it
pub fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after = stat.rsplit(')').next().unwrap_or("");
    let f: Vec<&str> = after.split_whitespace().collect();
    let tick = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (tick(11) + tick(12)) / 100.0
}
