//! The archive's on-disk names, magics, format version and limits, shared
//! by the epoch writer ([`super::seal`]) and the store that reads the files
//! back and keeps the header list ([`super::store`], which re-exports
//! them). Layouts in `docs/archive.md` ("On disk").

/// Magic of an epoch file.
pub const EPOCH_FILE_MAGIC: [u8; 8] = *b"KKHAEPOC";
/// Magic of the epoch header list (`epochs.dat`).
pub const INDEX_FILE_MAGIC: [u8; 8] = *b"KKHAINDX";
/// On-disk format version of both files.
pub const FORMAT_VERSION: u8 = 1;
/// Most spent outputs in one epoch (2³⁰; mainnet epochs hold ~10⁷).
pub const MAX_EPOCH_LEAVES: usize = 1 << 30;
/// Name of the header list file.
pub const INDEX_FILE: &str = "epochs.dat";
