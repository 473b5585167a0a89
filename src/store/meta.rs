//! The index database's format version, with its history, and the names
//! of its metadata rows (`meta_by_name`).

use std::path::Path;

use super::{StoreError, Trees};

/// Format version of the index database: (major, minor). A major mismatch
/// refuses to open; a minor upgrade runs in place.
///
/// 1.1 added `spend_by_outpoint_block`; a 1.0 datadir opens, and the blocks
/// it connected before have no rows there (the HTTP API then reports such
/// outputs spent without the spender once the UTXO table purged them).
///
/// 2.0 (a 1.x datadir is refused: move it aside and re-import or resync):
/// - each spent-output record in the `spent/` flat files ends in a CRC-32
///   ([`super::spent`]), so a damaged file is refused instead of feeding
///   wrong values to the archive and HTTP answers; 1.x records have none and
///   cannot be told apart;
/// - `block_id_by_hash` is gone: it was written for every block record and
///   never read (the block index, rebuilt from `block_by_id` at open, maps
///   hashes to ids in memory), and its random-order inserts were most of
///   the database's work in a headers sync.
///
/// 2.1: headers accepted without their block (a P2P headers sync) are
/// appended to the `headers/` flat files (`store::headers`, committed
/// length under meta key `flat_headers`) instead of `block_by_id`, so the
/// block ids in `block_by_id` are no longer dense. A 2.0 datadir opens
/// as is. A 2.1 datadir with headers-only blocks is refused by a 2.0
/// build ("not dense"), which changes nothing.
///
/// 3.0 (a 2.x datadir is refused: `kakehi reindex-chainstate` rebuilds it
/// from its block files): the transaction and spend rows keep only what the
/// flat files do not (electrs's layout): `tx_position_by_txid_block` (txid
/// ‖ block → position, 40 bytes a row) became `tx_by_txid_prefix` (txid
/// prefix ‖ block ‖ position, 16 bytes), and `spend_by_outpoint_block`
/// (outpoint ‖ block → spending txid ‖ vin, 76 bytes) became
/// `spend_by_outpoint_prefix` (txid prefix ‖ vout ‖ block, 16 bytes; the
/// spender is read from the block's spent-output record). Readers check a
/// row against the files it points at.
///
/// 4.0 (a 3.x datadir is refused: `kakehi reindex-chainstate` rebuilds it):
/// the address index takes the same layout. `history_by_script` (script
/// hash ‖ height ‖ block ‖ position ‖ kind ‖ vout/vin → txid ‖ value [‖
/// spent outpoint]: 49-byte keys, 40–76-byte values, one row per output and
/// per input) became `history_by_script_prefix` (script-hash prefix (8) ‖
/// height ‖ block ‖ position: 20 bytes, no value, one row per script and
/// transaction); readers take the txid, values and spent outpoints from the
/// block and spent-output files and check the full script hash there, so
/// neither a prefix shared with another script nor a row left by a block
/// that was never recorded under its id (a crash between the rows' flush
/// and the block records', then another block given the same id) can
/// show.
///
/// 5.0 (a 4.x datadir is refused: `kakehi reindex-chainstate` rebuilds it):
/// the three row trees (`tx_by_txid_prefix`, `spend_by_outpoint_prefix`,
/// `history_by_script_prefix`, same keys) moved out of sled into kakehi's
/// own sorted-run files under `index/rows/` ([`runs`](super::runs)): sled rewrote their
/// pages at every group (the index was 5x the raw blocks at 26k blocks for
/// 0.3 GB of rows) and replayed every log segment written since the last
/// open at each open (12.6 s at that height).
///
/// 5.1: a commit's rows go to a write-ahead row log (`index/rows/LOG`,
/// one synced record per commit) until 16 MiB of them are in memory, then
/// to run files; the row manifest's layout names the log's generation
/// (`KKHRMAN2`). A 5.0 datadir opens as is (no log: an empty one); a 5.0
/// build refuses a 5.1 row manifest as damaged, naming `kakehi
/// reindex-chainstate`.
///
/// 6.0 (a 5.x datadir is refused: `kakehi reindex-chainstate` rebuilds it):
/// the run files' layout 2 (`runs/run.rs`). The filter and the block index
/// come before the keys, sized by the capacity the writer was given, and
/// the filter's block for a prefix follows the prefix's order, so a run is
/// written in fixed memory whatever its size (layout 1 held its whole
/// filter and block index, ~1.33 bytes per key, until the end); the
/// partitions' checksums are stored in the file, so opening a run reads
/// its header and that summary (~0.0016 bytes per key) instead of its
/// whole filter and block index. Layout 1 runs are refused as damaged
/// ("bad magic or version", naming the file and `kakehi
/// reindex-chainstate`).
pub const FORMAT_VERSION: (u16, u16) = (6, 0);

/// Meta key of the format version: major u16 BE ‖ minor u16 BE.
pub(super) const META_FORMAT: &str = "format_version";
/// Meta key of the tip marker: the active tip's `BlockId`, u32 BE.
pub const META_TIP: &str = "tip";
/// Meta key of the last block whose changes were written to the UTXO table
/// (`BlockId`, u32 BE): one block ahead of the table's own commit after a
/// crash between the two, which start-up then replays.
pub const META_SOZU_LAST: &str = "sozu_last";
/// Meta key of where the UTXO table's writes not yet committed begin, in
/// the same batch as [`META_SOZU_LAST`]: the table's committed tip before
/// them (`BlockId` u32 BE; genesis for an empty table) ‖ the first block
/// written after it (u32 BE). After a crash between the index commit and
/// the table's, start-up checks that the table is at that tip and replays
/// the blocks from the first to `sozu_last` (one block, or a group of
/// blocks made durable together while catching up). Absent in datadirs
/// from before groups: the last block alone, on its parent.
pub const META_SOZU_BASE: &str = "sozu_base";
/// Meta keys of the committed end of each flat-file series (blocks,
/// filters, spent outputs): a [`FlatPos`](super::FlatPos), file number u32 BE ‖ length u64
/// BE. At open, each series is truncated to it.
pub const META_FLAT_BLOCKS: &str = "flat_blocks";
/// See [`META_FLAT_BLOCKS`].
pub const META_FLAT_FILTERS: &str = "flat_filters";
/// See [`META_FLAT_BLOCKS`].
pub const META_FLAT_SPENT: &str = "flat_spent";
/// See [`META_FLAT_BLOCKS`]: the `headers/` files (since format 2.1).
pub const META_FLAT_HEADERS: &str = "flat_headers";
/// Meta key of the UTXO set's MuHash3072 at the active tip, written in the
/// same batch as [`META_TIP`]: tip `BlockId` u32 BE ‖ numerator (384 bytes
/// LE) ‖ denominator (384 bytes LE) (`src/pipeline/utxo_hash.rs`). Absent or
/// naming another tip (a datadir from before it existed): rebuilt once from
/// the UTXO table at open; no format change needed.
pub const META_MUHASH: &str = "muhash";
/// Meta key of the address index's state (`history_by_script_prefix`): absent =
/// off or never built; `[1]` = complete (rows for every block of the active
/// chain, kept by every later connect); `[0] ‖ next height u32 BE ‖ BlockId
/// u32 BE of the block below it` = being built from the block files, up to
/// there (a build resumes from it while that block is still active).
pub const META_ADDRESS_INDEX: &str = "address_index";
/// Meta key of where the index rows' log ends after the rows of the
/// blocks this commit names ([`runs::LogPosition`](super::runs::LogPosition): generation u64 BE ‖
/// end u64 BE; since format 5.1). At open the log must reach it: a crash
/// mid-append tears only records after it, so a shorter log is damaged.
pub const META_ROWS_LOG: &str = "rows_log";

/// Checks a stored format version `v` (major u16 BE ‖ minor u16 BE).
pub(super) fn check_format(path: &Path, trees: &Trees, v: &[u8]) -> Result<(), StoreError> {
    let [a, b, c, d] = v else {
        return Err(trees.meta_by_name.corrupt("bad format_version"));
    };
    let (major, minor) = (u16::from_be_bytes([*a, *b]), u16::from_be_bytes([*c, *d]));
    if major != FORMAT_VERSION.0 {
        return Err(StoreError::FormatMismatch {
            path: path.to_path_buf(),
            found_major: major,
            found_minor: minor,
            major: FORMAT_VERSION.0,
        });
    }
    Ok(())
}
