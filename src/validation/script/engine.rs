//! The boundary to Bitcoin Core's script interpreter: a transaction decoded
//! and prepared once by Core ([`PreparedTx`]), then verified input by input
//! under a set of [`ScriptFlags`], with Core's [`ScriptError`] on failure.
//!
//! The interpreter is Bitcoin Core 26.0's (`src/script/interpreter.cpp`,
//! libsecp256k1 for signatures), built by the `bitcoinconsensus` crate
//! (0.106.0+26.0, rust-bitcoin's build of libbitcoinconsensus). Its C API
//! answers only valid/invalid, one input at a time, decoding the
//! transaction and hashing its prevouts again at every call, and refuses
//! every flag outside the consensus set; so kakehi calls the interpreter
//! through a small C++ glue file of its own (`engine.cpp`, compiled by
//! `build.rs` against the same Core headers) that does what Core's block
//! validation does: decode once, `PrecomputedTransactionData::Init` once,
//! `VerifyScript` per input with a `TransactionSignatureChecker`, and
//! return the `ScriptError` (Core's `CScriptCheck`, `src/validation.cpp`).
//!
//! This file holds the only `unsafe` of the crate: the calls into that glue.
//! Every precondition Core asserts on (input index, flag combination,
//! spent-output count) is checked by the glue and comes back as a
//! [`VerifyError`]; C++ exceptions never cross the boundary.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::ptr::NonNull;
use std::sync::OnceLock;

use bitcoin::Amount;

use super::flags::ScriptFlags;

// Links Bitcoin Core 26.0's interpreter and libsecp256k1, which the
// `bitcoinconsensus` crate builds as static libraries and engine.cpp calls.
use bitcoinconsensus as _;

extern "C" {
    fn kakehi_tx_prepare(
        tx: *const u8,
        tx_len: usize,
        values: *const i64,
        scripts: *const *const u8,
        script_lens: *const usize,
        n_spent: usize,
        status: *mut c_int,
    ) -> *mut c_void;
    fn kakehi_tx_verify(
        handle: *const c_void,
        n_in: c_uint,
        flags: c_uint,
        script_error: *mut c_int,
    ) -> c_int;
    fn kakehi_tx_free(handle: *mut c_void);
    fn kakehi_sha256_implementation() -> *const c_char;
    fn kakehi_script_error_count() -> c_int;
    fn kakehi_script_error_name(code: c_int) -> *const c_char;
    fn kakehi_script_error_message(code: c_int) -> *const c_char;
}

/// The SHA-256 implementation Core's hashing uses in the engine (its
/// signature hashes, BIP-143 and BIP-341 midstates): Core's
/// `SHA256AutoDetect` name, e.g. `"x86_shani(1way,2way)"` with the CPU's
/// SHA extensions, `"sse4(1way)"`, or `"standard"` (portable C++; the only
/// one on other architectures). Selected once, on the first call here or
/// the first [`PreparedTx::new`].
pub fn sha256_implementation() -> &'static str {
    static NAME: OnceLock<String> = OnceLock::new();
    NAME.get_or_init(|| {
        // SAFETY: the glue returns null or a pointer to a string in static
        // storage, NUL-terminated, never freed.
        let ptr = unsafe { kakehi_sha256_implementation() };
        if ptr.is_null() {
            return "unknown".into();
        }
        // SAFETY: non-null and NUL-terminated, see above.
        let name = unsafe { CStr::from_ptr(ptr) };
        name.to_string_lossy().into_owned()
    })
}

/// Status codes of the glue (`STATUS_*` in `engine.cpp`).
const STATUS_OK: c_int = 0;
const STATUS_SCRIPT_FAILED: c_int = 1;
const STATUS_BAD_TRANSACTION: c_int = 2;
const STATUS_SPENT_COUNT: c_int = 3;
const STATUS_INPUT_INDEX: c_int = 4;
const STATUS_FLAGS: c_int = 5;

/// The prefix of Core's reject reason for a script failure in a block
/// (`ConnectBlock`, `src/validation.cpp`, Bitcoin Core 30.0 and later;
/// Core 26 to 29 said `mandatory-script-verify-flag-failed`).
pub const BLOCK_SCRIPT_FAILURE: &str = "block-script-verify-flag-failed";

/// One of Bitcoin Core's script errors (`ScriptError_t`,
/// `src/script/script_error.h`, Core 26.0): why the interpreter refused an
/// input. [`ScriptError::message`] is Core's `ScriptErrorString`, the text
/// Core puts in its reject reasons.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct ScriptError {
    code: u32,
}

impl ScriptError {
    /// The error with Core's numeric code (0 = `OK`, 1 = `UNKNOWN_ERROR`,
    /// 2 = `EVAL_FALSE`, …); `None` past the last code.
    pub fn from_code(code: u32) -> Option<Self> {
        (code < Self::count()).then_some(ScriptError { code })
    }

    /// The error whose [`ScriptError::name`] is `name`.
    pub fn from_name(name: &str) -> Option<Self> {
        (0..Self::count())
            .map(|code| ScriptError { code })
            .find(|e| e.name() == name)
    }

    /// Number of codes Core 26.0 defines (`SCRIPT_ERR_ERROR_COUNT`).
    pub fn count() -> u32 {
        // SAFETY: a pure function of the glue with no arguments.
        let n = unsafe { kakehi_script_error_count() };
        u32::try_from(n).unwrap_or(0)
    }

    /// Core's numeric code.
    pub fn code(self) -> u32 {
        self.code
    }

    /// Core's enumerator name without `SCRIPT_ERR_` (`EVAL_FALSE`,
    /// `SIG_DER`, `SCHNORR_SIG`, …).
    pub fn name(self) -> &'static str {
        let code = c_int::try_from(self.code).unwrap_or(1);
        // SAFETY: the glue returns a pointer to a string literal (static
        // storage), NUL-terminated, for every code.
        let name = unsafe { CStr::from_ptr(kakehi_script_error_name(code)) };
        name.to_str().unwrap_or("UNKNOWN_ERROR")
    }

    /// Core's `ScriptErrorString` ("Script evaluated without error but
    /// finished with a false/empty top stack element", …).
    pub fn message(self) -> &'static str {
        let code = c_int::try_from(self.code).unwrap_or(1);
        // SAFETY: the glue returns null or a pointer into a table built
        // once and never freed (static storage), NUL-terminated.
        let ptr = unsafe { kakehi_script_error_message(code) };
        if ptr.is_null() {
            return "unknown error";
        }
        // SAFETY: non-null and NUL-terminated, see above.
        let message = unsafe { CStr::from_ptr(ptr) };
        message.to_str().unwrap_or("unknown error")
    }

    /// Core's reject reason for a block with this script failure:
    /// `block-script-verify-flag-failed (<message>)` ([`BLOCK_SCRIPT_FAILURE`]).
    pub fn block_reject_reason(self) -> &'static str {
        static REASONS: OnceLock<Vec<String>> = OnceLock::new();
        let reasons = REASONS.get_or_init(|| {
            (0..Self::count())
                .map(|code| {
                    let e = ScriptError { code };
                    format!("{BLOCK_SCRIPT_FAILURE} ({})", e.message())
                })
                .collect()
        });
        reasons
            .get(self.code as usize)
            .map_or(BLOCK_SCRIPT_FAILURE, String::as_str)
    }
}

impl std::fmt::Display for ScriptError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.message())
    }
}

impl std::fmt::Debug for ScriptError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ScriptError({})", self.name())
    }
}

impl std::error::Error for ScriptError {}

/// Why a transaction could not be verified, or failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum VerifyError {
    /// The input's scripts fail: Core's error.
    #[error("{error}")]
    Script {
        /// Core's script error.
        error: ScriptError,
    },
    /// Core cannot decode the transaction bytes, or bytes are left over.
    #[error("the transaction ({len} bytes) does not decode")]
    BadTransaction {
        /// Length of the bytes given.
        len: usize,
    },
    /// The number of spent outputs is not the transaction's input count.
    #[error("{given} spent outputs given, not one per input of the transaction")]
    SpentCount {
        /// How many were given.
        given: usize,
    },
    /// The input index is past the transaction's inputs.
    #[error("input {index} of a transaction with {inputs} inputs")]
    InputIndex {
        /// The index asked for.
        index: usize,
        /// The transaction's input count.
        inputs: usize,
    },
    /// The flags hold unknown bits, or a combination Core refuses (CLEANSTACK
    /// without P2SH and WITNESS, WITNESS without P2SH).
    #[error("invalid script flag combination {flags}")]
    Flags {
        /// The flags.
        flags: ScriptFlags,
    },
    /// The interpreter threw (out of memory): nothing was decided.
    #[error("the script interpreter failed with an exception")]
    Exception,
}

/// An output being spent, as the interpreter needs it: its value (the
/// 8 bytes the BIP143/BIP341 signature hashes commit to, as Core's signed
/// `CAmount`) and its scriptPubKey.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SpentTxOut<'a> {
    /// The output's value.
    pub value: Amount,
    /// The output's scriptPubKey.
    pub script_pubkey: &'a [u8],
}

/// A transaction decoded by Core with its signature-hash data precomputed
/// from the outputs it spends (Core's `PrecomputedTransactionData`), ready
/// to verify any of its inputs, from any number of threads at once.
pub struct PreparedTx {
    handle: NonNull<c_void>,
    inputs: usize,
}

// SAFETY: the glue's handle owns a `CTransaction` and its
// `PrecomputedTransactionData`, which `kakehi_tx_verify` only reads (Core
// runs its script checks on worker threads over the same data); it is
// freed once, in `Drop`.
unsafe impl Send for PreparedTx {}
// SAFETY: see `Send`: verification takes the handle as `const`.
unsafe impl Sync for PreparedTx {}

impl PreparedTx {
    /// Decodes `tx` (consensus serialization, with or without witness) and
    /// precomputes its signature hashes with `spent`, the outputs its
    /// inputs spend, in input order.
    ///
    /// # Errors
    /// [`VerifyError::BadTransaction`] when Core cannot decode the bytes (or
    /// bytes are left over), [`VerifyError::SpentCount`] when `spent` is not
    /// one output per input, [`VerifyError::Exception`].
    pub fn new(tx: &[u8], spent: &[SpentTxOut<'_>]) -> Result<Self, VerifyError> {
        let values: Vec<i64> = spent.iter().map(|s| s.value.to_sat() as i64).collect();
        let scripts: Vec<*const u8> = spent.iter().map(|s| s.script_pubkey.as_ptr()).collect();
        let lens: Vec<usize> = spent.iter().map(|s| s.script_pubkey.len()).collect();
        let mut status: c_int = STATUS_OK;
        // SAFETY: every pointer covers the length passed with it (`tx`, and
        // `spent.len()` entries of `values`, `scripts`, `lens`, each script
        // pointer valid for its length), all borrowed for this call only;
        // the glue copies what it keeps.
        let handle = unsafe {
            kakehi_tx_prepare(
                tx.as_ptr(),
                tx.len(),
                values.as_ptr(),
                scripts.as_ptr(),
                lens.as_ptr(),
                spent.len(),
                &mut status,
            )
        };
        match (NonNull::new(handle), status) {
            (Some(handle), STATUS_OK) => Ok(PreparedTx {
                handle,
                inputs: spent.len(),
            }),
            (Some(handle), _) => {
                // SAFETY: a handle the glue returned, freed once.
                unsafe { kakehi_tx_free(handle.as_ptr()) };
                Err(VerifyError::Exception)
            }
            (None, STATUS_BAD_TRANSACTION) => Err(VerifyError::BadTransaction { len: tx.len() }),
            (None, STATUS_SPENT_COUNT) => Err(VerifyError::SpentCount { given: spent.len() }),
            (None, _) => Err(VerifyError::Exception),
        }
    }

    /// The transaction's number of inputs.
    pub fn inputs(&self) -> usize {
        self.inputs
    }

    /// Verifies input `index` under `flags`: Core's `VerifyScript` with the
    /// input's scriptSig and witness, the spent output's scriptPubKey and
    /// value, and a signature checker over this transaction.
    ///
    /// # Errors
    /// [`VerifyError::Script`] with Core's error when the input is invalid;
    /// [`VerifyError::InputIndex`], [`VerifyError::Flags`] for bad
    /// arguments, [`VerifyError::Exception`].
    pub fn verify(&self, index: usize, flags: ScriptFlags) -> Result<(), VerifyError> {
        let Ok(n_in) = c_uint::try_from(index) else {
            return Err(VerifyError::InputIndex {
                index,
                inputs: self.inputs,
            });
        };
        let mut code: c_int = 1;
        // SAFETY: `handle` is live (freed only in Drop) and only read by the
        // glue; `code` is a valid out-pointer for this call.
        let status =
            unsafe { kakehi_tx_verify(self.handle.as_ptr(), n_in, flags.bits(), &mut code) };
        match status {
            STATUS_OK => Ok(()),
            STATUS_SCRIPT_FAILED => Err(VerifyError::Script {
                error: ScriptError::from_code(u32::try_from(code).unwrap_or(1))
                    .unwrap_or(ScriptError { code: 1 }),
            }),
            STATUS_INPUT_INDEX => Err(VerifyError::InputIndex {
                index,
                inputs: self.inputs,
            }),
            STATUS_FLAGS => Err(VerifyError::Flags { flags }),
            _ => Err(VerifyError::Exception),
        }
    }
}

impl Drop for PreparedTx {
    fn drop(&mut self) {
        // SAFETY: the handle came from `kakehi_tx_prepare` and is freed
        // exactly once, here.
        unsafe { kakehi_tx_free(self.handle.as_ptr()) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Core's SHA-256 in the engine uses the CPU's SHA extensions where it
    /// has them: fails when the linker takes the `bitcoinconsensus` crate's
    /// portable-only `sha256.o` instead of the one build.rs compiles.
    #[test]
    fn sha256_uses_the_cpus_sha_extensions() {
        let name = sha256_implementation();
        #[cfg(target_arch = "x86_64")]
        {
            let shani = std::arch::is_x86_feature_detected!("sha")
                && std::arch::is_x86_feature_detected!("sse4.1");
            if shani {
                assert_eq!(name, "x86_shani(1way,2way)");
            } else if std::arch::is_x86_feature_detected!("sse4.1") {
                assert_eq!(name, "sse4(1way)");
            }
        }
        assert_ne!(name, "unknown");
    }

    #[test]
    fn error_names_and_messages_are_cores() {
        assert_eq!(
            ScriptError::count(),
            53,
            "Core 26.0 defines 53 script errors"
        );
        let eval_false = ScriptError::from_name("EVAL_FALSE").unwrap();
        assert_eq!(eval_false.code(), 2);
        assert_eq!(
            eval_false.message(),
            "Script evaluated without error but finished with a false/empty top stack element"
        );
        assert_eq!(
            eval_false.block_reject_reason(),
            "block-script-verify-flag-failed (Script evaluated without error but finished with a false/empty top stack element)"
        );
        let names: std::collections::HashSet<_> = (0..ScriptError::count())
            .map(|c| ScriptError::from_code(c).unwrap().name())
            .collect();
        assert_eq!(
            names.len() as u32,
            ScriptError::count(),
            "names are distinct"
        );
        assert!(ScriptError::from_code(ScriptError::count()).is_none());
    }

    #[test]
    fn bad_bytes_and_counts_are_errors_not_aborts() {
        assert_eq!(
            PreparedTx::new(&[1, 2, 3], &[]).err(),
            Some(VerifyError::BadTransaction { len: 3 })
        );
        let tx = bitcoin::consensus::serialize(&bitcoin::Transaction {
            version: bitcoin::transaction::Version::ONE,
            lock_time: bitcoin::absolute::LockTime::ZERO,
            input: vec![bitcoin::TxIn::default()],
            output: vec![bitcoin::TxOut::NULL],
        });
        assert_eq!(
            PreparedTx::new(&tx, &[]).err(),
            Some(VerifyError::SpentCount { given: 0 })
        );
        let mut trailing = tx.clone();
        trailing.push(0);
        let spent = [SpentTxOut {
            value: Amount::ZERO,
            script_pubkey: &[0x51],
        }];
        assert!(matches!(
            PreparedTx::new(&trailing, &spent),
            Err(VerifyError::BadTransaction { .. })
        ));
        let p = PreparedTx::new(&tx, &spent).unwrap();
        assert_eq!(p.verify(0, ScriptFlags::P2SH), Ok(()), "OP_TRUE spends");
        assert_eq!(
            p.verify(1, ScriptFlags::P2SH),
            Err(VerifyError::InputIndex {
                index: 1,
                inputs: 1
            })
        );
        // Core asserts on WITNESS without P2SH, and on unknown bits.
        assert!(matches!(
            p.verify(0, ScriptFlags::WITNESS),
            Err(VerifyError::Flags { .. })
        ));
        assert!(matches!(
            p.verify(0, ScriptFlags::from_bits(1 << 25)),
            Err(VerifyError::Flags { .. })
        ));
    }
}
