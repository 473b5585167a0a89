//! Where Bitcoin Core changed the script error an input reports between
//! 26.0 (kakehi's engine, the `bitcoinconsensus` crate) and 31.99 (Core's
//! test vectors in `testnet-data/core-vectors/` and the `pbk` judge). The
//! verdict (valid or not) never changed; only which error is named.

/// One change: what Core 31.99 reports, what Core 26.0 reports instead,
/// both as (enumerator name without `SCRIPT_ERR_`, `ScriptErrorString`).
pub struct ErrorChange {
    /// Core 31.99's error.
    pub core31: (&'static str, &'static str),
    /// Core 26.0's error for the same case.
    pub core26: (&'static str, &'static str),
    /// Only for OP_IF / OP_NOTIF (the change is about their empty stack).
    pub needs_if: bool,
}

/// The three changes, with their sources in Core.
pub const CHANGES: [ErrorChange; 3] = [
    // SCRIPT_ERR_SCRIPTNUM is newer than Core 26, which reports a CScriptNum
    // overflow through EvalScript's catch-all.
    ErrorChange {
        core31: (
            "SCRIPTNUM",
            "Script number overflowed or is non-minimally encoded",
        ),
        core26: ("UNKNOWN_ERROR", "unknown error"),
        needs_if: false,
    },
    // SCRIPT_ERR_TAPSCRIPT_EMPTY_PUBKEY is newer than Core 26, whose
    // EvalChecksigTapscript reports PUBKEYTYPE for an empty key.
    ErrorChange {
        core31: ("TAPSCRIPT_EMPTY_PUBKEY", "Empty public key in tapscript"),
        core26: (
            "PUBKEYTYPE",
            "Public key is neither compressed or uncompressed",
        ),
        needs_if: false,
    },
    // Core PR #32143 (merged 2026-01, in 31.99): OP_IF/OP_NOTIF on an empty
    // stack is INVALID_STACK_OPERATION; Core 26 says UNBALANCED_CONDITIONAL.
    ErrorChange {
        core31: (
            "INVALID_STACK_OPERATION",
            "Operation not valid with the current stack size",
        ),
        core26: ("UNBALANCED_CONDITIONAL", "Invalid OP_IF construction"),
        needs_if: true,
    },
];

/// Whether Core 31.99 reporting `core31` where the engine reports `core26`
/// (both names, or both messages) is one of [`CHANGES`]; `has_if`: the
/// scripts involved contain OP_IF or OP_NOTIF.
pub fn is_version_change(core31: &str, core26: &str, has_if: bool) -> bool {
    CHANGES.iter().any(|c| {
        let names = c.core31.0 == core31 && c.core26.0 == core26;
        let messages = c.core31.1 == core31 && c.core26.1 == core26;
        (names || messages) && (has_if || !c.needs_if)
    })
}
