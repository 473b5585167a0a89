// kakehi's glue to Bitcoin Core's script interpreter.
//
// The interpreter itself (VerifyScript, the signature checkers, sighashes,
// libsecp256k1) is Bitcoin Core 26.0's, compiled by the `bitcoinconsensus`
// crate (0.106.0+26.0) from the sources it vendors; this file is compiled
// by kakehi's build.rs against the same headers and links against that
// library. It adds nothing to the rules: it decodes a transaction once,
// precomputes its signature-hash data once (Core's
// PrecomputedTransactionData::Init, as Core's CheckInputScripts does), and
// calls VerifyScript per input exactly as Core's CScriptCheck does
// (src/validation.cpp), returning Core's ScriptError, which
// libbitcoinconsensus's C API does not expose.
//
// Two differences from that library's build, for speed only: the
// transaction is decoded as a CMutableTransaction (no txid and wtxid are
// computed: the interpreter does not use them, and Core instantiates every
// template it needs for that type, as its signing code uses it), and Core's
// SHA-256 picks the CPU's SHA extensions (SHA256AutoDetect, as bitcoind
// calls at start), which that library never calls; build.rs compiles
// Core's sha256.cpp with them.
//
// Every function is noexcept towards Rust: C++ exceptions never cross the
// boundary. Every precondition Core asserts (flag combinations, input
// index, spent-output count) is checked here first and reported as a
// status, so no input can abort the process.

#include <crypto/sha256.h>
#include <primitives/transaction.h>
#include <script/interpreter.h>
#include <script/script_error.h>
#include <span.h>
#include <version.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <ios>
#include <memory>
#include <string>
#include <vector>

// The flag bits kakehi's Rust side names (src/validation/script/flags.rs)
// must be Core's.
static_assert(SCRIPT_VERIFY_P2SH == (1U << 0));
static_assert(SCRIPT_VERIFY_STRICTENC == (1U << 1));
static_assert(SCRIPT_VERIFY_DERSIG == (1U << 2));
static_assert(SCRIPT_VERIFY_LOW_S == (1U << 3));
static_assert(SCRIPT_VERIFY_NULLDUMMY == (1U << 4));
static_assert(SCRIPT_VERIFY_SIGPUSHONLY == (1U << 5));
static_assert(SCRIPT_VERIFY_MINIMALDATA == (1U << 6));
static_assert(SCRIPT_VERIFY_DISCOURAGE_UPGRADABLE_NOPS == (1U << 7));
static_assert(SCRIPT_VERIFY_CLEANSTACK == (1U << 8));
static_assert(SCRIPT_VERIFY_CHECKLOCKTIMEVERIFY == (1U << 9));
static_assert(SCRIPT_VERIFY_CHECKSEQUENCEVERIFY == (1U << 10));
static_assert(SCRIPT_VERIFY_WITNESS == (1U << 11));
static_assert(SCRIPT_VERIFY_DISCOURAGE_UPGRADABLE_WITNESS_PROGRAM == (1U << 12));
static_assert(SCRIPT_VERIFY_MINIMALIF == (1U << 13));
static_assert(SCRIPT_VERIFY_NULLFAIL == (1U << 14));
static_assert(SCRIPT_VERIFY_WITNESS_PUBKEYTYPE == (1U << 15));
static_assert(SCRIPT_VERIFY_CONST_SCRIPTCODE == (1U << 16));
static_assert(SCRIPT_VERIFY_TAPROOT == (1U << 17));
static_assert(SCRIPT_VERIFY_DISCOURAGE_UPGRADABLE_TAPROOT_VERSION == (1U << 18));
static_assert(SCRIPT_VERIFY_DISCOURAGE_OP_SUCCESS == (1U << 19));
static_assert(SCRIPT_VERIFY_DISCOURAGE_UPGRADABLE_PUBKEYTYPE == (1U << 20));

namespace {

// Status codes of kakehi_tx_prepare and kakehi_tx_verify (mirrored by
// `Status` in src/validation/script/engine.rs).
constexpr int STATUS_OK = 0;
constexpr int STATUS_SCRIPT_FAILED = 1;
constexpr int STATUS_BAD_TRANSACTION = 2;
constexpr int STATUS_SPENT_COUNT = 3;
constexpr int STATUS_INPUT_INDEX = 4;
constexpr int STATUS_FLAGS = 5;
constexpr int STATUS_EXCEPTION = 6;

// Every flag bit Core 26 defines.
constexpr unsigned int ALL_FLAGS = (1U << 21) - 1;

// Reads a transaction from a byte slice (the stream Core's deserializer
// wants; the same as libbitcoinconsensus's TxInputStream).
class ByteStream
{
public:
    ByteStream(const unsigned char* data, size_t len) : m_data(data), m_remaining(len) {}

    void read(Span<std::byte> dst)
    {
        if (dst.size() > m_remaining) {
            throw std::ios_base::failure("end of data");
        }
        if (dst.size() > 0) {
            std::memcpy(dst.data(), m_data, dst.size());
        }
        m_remaining -= dst.size();
        m_data += dst.size();
    }

    template <typename T>
    ByteStream& operator>>(T&& obj)
    {
        ::Unserialize(*this, obj);
        return *this;
    }

    // With witness: the version carries no SERIALIZE_TRANSACTION_NO_WITNESS.
    int GetVersion() const { return PROTOCOL_VERSION; }

    size_t remaining() const { return m_remaining; }

private:
    const unsigned char* m_data;
    size_t m_remaining;
};

struct PreparedTx {
    explicit PreparedTx(ByteStream& s) : tx(deserialize, s) {}
    const CMutableTransaction tx;
    PrecomputedTransactionData txdata;
};

// Core's IsValidFlagCombination (src/script/interpreter.cpp of later
// versions), plus unknown bits: VerifyScript asserts on the first two.
bool valid_flags(unsigned int flags)
{
    if (flags & ~ALL_FLAGS) return false;
    if ((flags & SCRIPT_VERIFY_CLEANSTACK) && (~flags & (SCRIPT_VERIFY_P2SH | SCRIPT_VERIFY_WITNESS))) return false;
    if ((flags & SCRIPT_VERIFY_WITNESS) && (~flags & SCRIPT_VERIFY_P2SH)) return false;
    return true;
}

// The enumerator names of Core's ScriptError_t, without `SCRIPT_ERR_`.
// No default case: -Wswitch names any enumerator left out.
const char* error_name(ScriptError e)
{
    switch (e) {
    case SCRIPT_ERR_OK: return "OK";
    case SCRIPT_ERR_UNKNOWN_ERROR: return "UNKNOWN_ERROR";
    case SCRIPT_ERR_EVAL_FALSE: return "EVAL_FALSE";
    case SCRIPT_ERR_OP_RETURN: return "OP_RETURN";
    case SCRIPT_ERR_SCRIPT_SIZE: return "SCRIPT_SIZE";
    case SCRIPT_ERR_PUSH_SIZE: return "PUSH_SIZE";
    case SCRIPT_ERR_OP_COUNT: return "OP_COUNT";
    case SCRIPT_ERR_STACK_SIZE: return "STACK_SIZE";
    case SCRIPT_ERR_SIG_COUNT: return "SIG_COUNT";
    case SCRIPT_ERR_PUBKEY_COUNT: return "PUBKEY_COUNT";
    case SCRIPT_ERR_VERIFY: return "VERIFY";
    case SCRIPT_ERR_EQUALVERIFY: return "EQUALVERIFY";
    case SCRIPT_ERR_CHECKMULTISIGVERIFY: return "CHECKMULTISIGVERIFY";
    case SCRIPT_ERR_CHECKSIGVERIFY: return "CHECKSIGVERIFY";
    case SCRIPT_ERR_NUMEQUALVERIFY: return "NUMEQUALVERIFY";
    case SCRIPT_ERR_BAD_OPCODE: return "BAD_OPCODE";
    case SCRIPT_ERR_DISABLED_OPCODE: return "DISABLED_OPCODE";
    case SCRIPT_ERR_INVALID_STACK_OPERATION: return "INVALID_STACK_OPERATION";
    case SCRIPT_ERR_INVALID_ALTSTACK_OPERATION: return "INVALID_ALTSTACK_OPERATION";
    case SCRIPT_ERR_UNBALANCED_CONDITIONAL: return "UNBALANCED_CONDITIONAL";
    case SCRIPT_ERR_NEGATIVE_LOCKTIME: return "NEGATIVE_LOCKTIME";
    case SCRIPT_ERR_UNSATISFIED_LOCKTIME: return "UNSATISFIED_LOCKTIME";
    case SCRIPT_ERR_SIG_HASHTYPE: return "SIG_HASHTYPE";
    case SCRIPT_ERR_SIG_DER: return "SIG_DER";
    case SCRIPT_ERR_MINIMALDATA: return "MINIMALDATA";
    case SCRIPT_ERR_SIG_PUSHONLY: return "SIG_PUSHONLY";
    case SCRIPT_ERR_SIG_HIGH_S: return "SIG_HIGH_S";
    case SCRIPT_ERR_SIG_NULLDUMMY: return "SIG_NULLDUMMY";
    case SCRIPT_ERR_PUBKEYTYPE: return "PUBKEYTYPE";
    case SCRIPT_ERR_CLEANSTACK: return "CLEANSTACK";
    case SCRIPT_ERR_MINIMALIF: return "MINIMALIF";
    case SCRIPT_ERR_SIG_NULLFAIL: return "SIG_NULLFAIL";
    case SCRIPT_ERR_DISCOURAGE_UPGRADABLE_NOPS: return "DISCOURAGE_UPGRADABLE_NOPS";
    case SCRIPT_ERR_DISCOURAGE_UPGRADABLE_WITNESS_PROGRAM: return "DISCOURAGE_UPGRADABLE_WITNESS_PROGRAM";
    case SCRIPT_ERR_DISCOURAGE_UPGRADABLE_TAPROOT_VERSION: return "DISCOURAGE_UPGRADABLE_TAPROOT_VERSION";
    case SCRIPT_ERR_DISCOURAGE_OP_SUCCESS: return "DISCOURAGE_OP_SUCCESS";
    case SCRIPT_ERR_DISCOURAGE_UPGRADABLE_PUBKEYTYPE: return "DISCOURAGE_UPGRADABLE_PUBKEYTYPE";
    case SCRIPT_ERR_WITNESS_PROGRAM_WRONG_LENGTH: return "WITNESS_PROGRAM_WRONG_LENGTH";
    case SCRIPT_ERR_WITNESS_PROGRAM_WITNESS_EMPTY: return "WITNESS_PROGRAM_WITNESS_EMPTY";
    case SCRIPT_ERR_WITNESS_PROGRAM_MISMATCH: return "WITNESS_PROGRAM_MISMATCH";
    case SCRIPT_ERR_WITNESS_MALLEATED: return "WITNESS_MALLEATED";
    case SCRIPT_ERR_WITNESS_MALLEATED_P2SH: return "WITNESS_MALLEATED_P2SH";
    case SCRIPT_ERR_WITNESS_UNEXPECTED: return "WITNESS_UNEXPECTED";
    case SCRIPT_ERR_WITNESS_PUBKEYTYPE: return "WITNESS_PUBKEYTYPE";
    case SCRIPT_ERR_SCHNORR_SIG_SIZE: return "SCHNORR_SIG_SIZE";
    case SCRIPT_ERR_SCHNORR_SIG_HASHTYPE: return "SCHNORR_SIG_HASHTYPE";
    case SCRIPT_ERR_SCHNORR_SIG: return "SCHNORR_SIG";
    case SCRIPT_ERR_TAPROOT_WRONG_CONTROL_SIZE: return "TAPROOT_WRONG_CONTROL_SIZE";
    case SCRIPT_ERR_TAPSCRIPT_VALIDATION_WEIGHT: return "TAPSCRIPT_VALIDATION_WEIGHT";
    case SCRIPT_ERR_TAPSCRIPT_CHECKMULTISIG: return "TAPSCRIPT_CHECKMULTISIG";
    case SCRIPT_ERR_TAPSCRIPT_MINIMALIF: return "TAPSCRIPT_MINIMALIF";
    case SCRIPT_ERR_OP_CODESEPARATOR: return "OP_CODESEPARATOR";
    case SCRIPT_ERR_SIG_FINDANDDELETE: return "SIG_FINDANDDELETE";
    case SCRIPT_ERR_ERROR_COUNT: return "ERROR_COUNT";
    }
    return "UNKNOWN_ERROR";
}

// Core's ScriptErrorString for every code, built once; the pointers into it
// live as long as the program.
const std::vector<std::string>& error_messages()
{
    static const std::vector<std::string> messages = [] {
        std::vector<std::string> v;
        for (int i = 0; i <= SCRIPT_ERR_ERROR_COUNT; ++i) {
            v.push_back(ScriptErrorString(static_cast<ScriptError>(i)));
        }
        return v;
    }();
    return messages;
}

// Selects the fastest SHA-256 the CPU has, once (a thread-safe static:
// every hash the glue makes follows a kakehi_tx_prepare, which calls this
// first), and names it ("standard", "sse4(1way)", "x86_shani(1way,2way)").
const std::string& sha256_name()
{
    static const std::string name = SHA256AutoDetect();
    return name;
}

} // namespace

extern "C" {

// Decodes `tx` (`tx_len` bytes, with or without witness) and precomputes
// its signature-hash data with the `n_spent` outputs it spends (values in
// sats, scriptPubKeys as pointer + length), one per input in order. On
// success returns an owned handle and sets *status to STATUS_OK; else
// returns null and sets *status (STATUS_BAD_TRANSACTION: does not decode or
// has trailing bytes; STATUS_SPENT_COUNT: n_spent is not its input count).
void* kakehi_tx_prepare(const unsigned char* tx, size_t tx_len, const int64_t* values,
                        const unsigned char* const* scripts, const size_t* script_lens,
                        size_t n_spent, int* status) noexcept
{
    try {
        sha256_name();
        ByteStream stream(tx, tx_len);
        auto prepared = std::make_unique<PreparedTx>(stream);
        if (stream.remaining() != 0) {
            *status = STATUS_BAD_TRANSACTION;
            return nullptr;
        }
        if (prepared->tx.vin.size() != n_spent) {
            *status = STATUS_SPENT_COUNT;
            return nullptr;
        }
        std::vector<CTxOut> spent;
        spent.reserve(n_spent);
        for (size_t i = 0; i < n_spent; ++i) {
            spent.emplace_back(CAmount{values[i]}, CScript(scripts[i], scripts[i] + script_lens[i]));
        }
        prepared->txdata.Init(prepared->tx, std::move(spent));
        *status = STATUS_OK;
        return prepared.release();
    } catch (const std::ios_base::failure&) {
        *status = STATUS_BAD_TRANSACTION;
    } catch (...) {
        *status = STATUS_EXCEPTION;
    }
    return nullptr;
}

// Verifies input `n_in` of a prepared transaction under `flags` (Core's
// SCRIPT_VERIFY_* bits): STATUS_OK, or STATUS_SCRIPT_FAILED with Core's
// ScriptError in *script_error, or STATUS_INPUT_INDEX / STATUS_FLAGS for
// an argument Core would assert on. Safe to call from many threads at
// once on the same handle (it is only read).
int kakehi_tx_verify(const void* handle, unsigned int n_in, unsigned int flags,
                     int* script_error) noexcept
{
    const auto* p = static_cast<const PreparedTx*>(handle);
    *script_error = SCRIPT_ERR_UNKNOWN_ERROR;
    if (n_in >= p->tx.vin.size()) return STATUS_INPUT_INDEX;
    if (!valid_flags(flags)) return STATUS_FLAGS;
    try {
        const CTxIn& input = p->tx.vin[n_in];
        const CTxOut& prevout = p->txdata.m_spent_outputs[n_in];
        ScriptError err = SCRIPT_ERR_UNKNOWN_ERROR;
        const bool ok = VerifyScript(input.scriptSig, prevout.scriptPubKey, &input.scriptWitness, flags,
                                     MutableTransactionSignatureChecker(&p->tx, n_in, prevout.nValue, p->txdata, MissingDataBehavior::FAIL),
                                     &err);
        *script_error = err;
        return ok ? STATUS_OK : STATUS_SCRIPT_FAILED;
    } catch (...) {
        return STATUS_EXCEPTION;
    }
}

// Frees a handle of kakehi_tx_prepare (null is allowed).
void kakehi_tx_free(void* handle) noexcept
{
    delete static_cast<PreparedTx*>(handle);
}

// The SHA-256 implementation Core's hashing uses (see
// sha256_name), or null when it could not be named.
const char* kakehi_sha256_implementation() noexcept
{
    try {
        return sha256_name().c_str();
    } catch (...) {
        return nullptr;
    }
}

// The number of ScriptError codes (Core's SCRIPT_ERR_ERROR_COUNT).
int kakehi_script_error_count() noexcept
{
    return SCRIPT_ERR_ERROR_COUNT;
}

// The enumerator name of ScriptError `code` without `SCRIPT_ERR_` (a
// static string), or "UNKNOWN_ERROR" for a code out of range.
const char* kakehi_script_error_name(int code) noexcept
{
    if (code < 0 || code > SCRIPT_ERR_ERROR_COUNT) return "UNKNOWN_ERROR";
    return error_name(static_cast<ScriptError>(code));
}

// Core's ScriptErrorString of `code` (a string that lives as long as the
// program), or null when building the table failed.
const char* kakehi_script_error_message(int code) noexcept
{
    try {
        const auto& messages = error_messages();
        if (code < 0 || code > SCRIPT_ERR_ERROR_COUNT) code = SCRIPT_ERR_UNKNOWN_ERROR;
        return messages[static_cast<size_t>(code)].c_str();
    } catch (...) {
        return nullptr;
    }
}

} // extern "C"
