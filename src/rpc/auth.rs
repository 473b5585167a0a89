//! JSON-RPC authentication as bitcoind does it (`src/httprpc.cpp`): HTTP
//! Basic credentials checked against the cookie (`<datadir>/.cookie`,
//! `__cookie__:<64 hex>`), `rpcuser`/`rpcpassword` and `rpcauth` entries
//! (`user:salt$hmac`, HMAC-SHA256 keyed by the salt over the password, as
//! `share/rpcauth/rpcauth.py` makes them).

use std::path::{Path, PathBuf};

use bitcoin_hashes::{hmac, sha256, Hash as _, HashEngine};

/// The cookie's user name (Core's `COOKIEAUTH_USER`).
pub const COOKIE_USER: &str = "__cookie__";

/// Errors of the RPC credentials.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    /// An `rpcauth` entry is not `user:salt$hmac` with a 64-hex HMAC.
    #[error("rpcauth entry {entry:?} is not user:salt$hmac (64 hex characters of HMAC-SHA256)")]
    BadRpcAuth {
        /// The entry, with its HMAC.
        entry: String,
    },
    /// The cookie file could not be written.
    #[error("writing the RPC cookie {path}: {source}")]
    Cookie {
        /// The cookie file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
}

/// One accepted credential.
#[derive(Clone, Debug)]
enum Credential {
    /// A user and its password (the cookie, `rpcuser`/`rpcpassword`).
    Plain { user: String, password: String },
    /// An `rpcauth` entry: HMAC-SHA256(key = salt, password) = `hmac`.
    Salted {
        user: String,
        salt: String,
        hmac: [u8; 32],
    },
}

/// The credentials the server accepts.
#[derive(Clone, Debug, Default)]
pub struct Credentials {
    list: Vec<Credential>,
}

impl Credentials {
    /// Accepts `user` with `password`.
    pub fn add_plain(&mut self, user: &str, password: &str) {
        self.list.push(Credential::Plain {
            user: user.into(),
            password: password.into(),
        });
    }

    /// Accepts an `rpcauth` entry `user:salt$hmac` (Core's `-rpcauth`).
    ///
    /// # Errors
    /// [`AuthError::BadRpcAuth`] for an entry of another shape.
    pub fn add_rpcauth(&mut self, entry: &str) -> Result<(), AuthError> {
        let bad = || AuthError::BadRpcAuth {
            entry: entry.into(),
        };
        let (user, rest) = entry.split_once(':').ok_or_else(bad)?;
        let (salt, hex) = rest.split_once('$').ok_or_else(bad)?;
        let hmac: [u8; 32] = bitcoin::hex::FromHex::from_hex(hex).map_err(|_| bad())?;
        self.list.push(Credential::Salted {
            user: user.into(),
            salt: salt.into(),
            hmac,
        });
        Ok(())
    }

    /// Whether no credential is accepted (every request is refused).
    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// Whether the `Authorization` header value `header` (`Basic <base64>`)
    /// carries an accepted user and password.
    pub fn check(&self, header: &str) -> bool {
        let Some(b64) = header.strip_prefix("Basic ") else {
            return false;
        };
        let Some(decoded) = base64_decode(b64.trim()) else {
            return false;
        };
        let Ok(decoded) = String::from_utf8(decoded) else {
            return false;
        };
        let Some((user, password)) = decoded.split_once(':') else {
            return false;
        };
        // Every entry is checked (no early exit), each in constant time.
        let mut ok = false;
        for c in &self.list {
            ok |= match c {
                Credential::Plain {
                    user: u,
                    password: p,
                } => {
                    ct_eq(u.as_bytes(), user.as_bytes()) & ct_eq(p.as_bytes(), password.as_bytes())
                }
                Credential::Salted {
                    user: u,
                    salt,
                    hmac,
                } => {
                    let mut e = hmac::HmacEngine::<sha256::Hash>::new(salt.as_bytes());
                    e.input(password.as_bytes());
                    let got = hmac::Hmac::<sha256::Hash>::from_engine(e);
                    ct_eq(u.as_bytes(), user.as_bytes())
                        & ct_eq(got.as_byte_array(), hmac.as_slice())
                }
            };
        }
        ok
    }
}

/// Equality of `a` and `b` in time depending only on their lengths (Core's
/// `TimingResistantEqual`).
fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Standard base64 (RFC 4648, with padding) decoded; `None` when malformed.
fn base64_decode(s: &str) -> Option<Vec<u8>> {
    fn val(c: u8) -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        } as u32)
    }
    let s = s.as_bytes();
    if !s.len().is_multiple_of(4) {
        return None;
    }
    let mut out = Vec::with_capacity(s.len() / 4 * 3);
    for (i, chunk) in s.chunks(4).enumerate() {
        let last = i + 1 == s.len() / 4;
        let pad = chunk.iter().rev().take_while(|&&c| c == b'=').count();
        if pad > 2 || (pad > 0 && !last) {
            return None;
        }
        let mut n: u32 = 0;
        for &c in &chunk[..4 - pad] {
            n = (n << 6) | val(c)?;
        }
        n <<= 6 * pad as u32;
        let bytes = [(n >> 16) as u8, (n >> 8) as u8, n as u8];
        out.extend_from_slice(&bytes[..3 - pad]);
    }
    Some(out)
}

/// The `Authorization` header value of HTTP Basic authentication for
/// `user_password` (`user:password`): `Basic <base64>` (RFC 7617), as a
/// client sends it.
pub fn basic_authorization(user_password: &str) -> String {
    const A: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut s = String::from("Basic ");
    for c in user_password.as_bytes().chunks(3) {
        let n = c
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | u32::from(*b) << (16 - 8 * i));
        for i in 0..4 {
            s.push(if i <= c.len() {
                A[(n >> (18 - 6 * i) & 63) as usize] as char
            } else {
                '='
            });
        }
    }
    s
}

/// The cookie file, removed when dropped (at a clean stop), as Core's
/// `DeleteAuthCookie`.
#[derive(Debug)]
pub struct Cookie {
    path: PathBuf,
    password: String,
}

impl Cookie {
    /// Writes `<datadir>/.cookie` as `__cookie__:<64 hex random>`, mode
    /// 0600 (through a temporary file renamed in place, as Core's
    /// `GenerateAuthCookie`).
    ///
    /// # Errors
    /// [`AuthError::Cookie`]: randomness or the file write failed.
    pub fn write(datadir: &Path) -> Result<Cookie, AuthError> {
        let path = datadir.join(".cookie");
        let err = |source| AuthError::Cookie {
            path: path.clone(),
            source,
        };
        let mut secret = [0u8; 32];
        getrandom::getrandom(&mut secret).map_err(|e| err(std::io::Error::other(e)))?;
        let password = bitcoin::hex::DisplayHex::to_lower_hex_string(&secret[..]);
        let tmp = datadir.join(".cookie.tmp");
        {
            use std::io::Write;
            let mut opts = std::fs::OpenOptions::new();
            opts.write(true).create(true).truncate(true);
            #[cfg(unix)]
            std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o600);
            let mut f = opts.open(&tmp).map_err(err)?;
            f.write_all(format!("{COOKIE_USER}:{password}").as_bytes())
                .map_err(err)?;
        }
        std::fs::rename(&tmp, &path).map_err(err)?;
        Ok(Cookie { path, password })
    }

    /// The cookie's password (its user is [`COOKIE_USER`]).
    pub fn password(&self) -> &str {
        &self.password
    }

    /// The cookie file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for Cookie {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_decodes_rfc4648_vectors() {
        for (e, d) in [
            ("", ""),
            ("Zg==", "f"),
            ("Zm8=", "fo"),
            ("Zm9v", "foo"),
            ("Zm9vYmFy", "foobar"),
        ] {
            assert_eq!(base64_decode(e).as_deref(), Some(d.as_bytes()), "{e}");
        }
        assert_eq!(base64_decode("Zg="), None);
        assert_eq!(base64_decode("Z==="), None);
        assert_eq!(base64_decode("Zg==Zg=="), None);
    }

    #[test]
    fn rpcauth_checks_the_salted_hmac() {
        // hmac.new(salt, password, "sha256").hexdigest() in Python, as
        // share/rpcauth/rpcauth.py computes it, for user "alice", password
        // "secret", salt "cb77f0957de88ff388cf817ddbc7273".
        let mut c = Credentials::default();
        c.add_rpcauth("alice:cb77f0957de88ff388cf817ddbc7273$c9ce7cb2de2ad5aadae1449ad1e62baa38d98fced30a7cd2eae656cab574b678")
            .expect("entry");
        let basic = basic_authorization;
        assert!(c.check(&basic("alice:secret")));
        assert!(!c.check(&basic("alice:secreT")));
        assert!(!c.check(&basic("bob:secret")));
        assert!(c.add_rpcauth("alice:salt$zz").is_err());
        // RFC 7617's example.
        assert_eq!(
            basic_authorization("Aladdin:open sesame"),
            "Basic QWxhZGRpbjpvcGVuIHNlc2FtZQ=="
        );
    }
}
