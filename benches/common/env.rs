//! Bench settings from the environment (included with `#[path]`).

use std::str::FromStr;

/// The value of the environment variable `name` parsed as `T` (a count of
/// rounds, seconds...), or `default` when it is unset or does not parse.
pub fn env_or<T: FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}
