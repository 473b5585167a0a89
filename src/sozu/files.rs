//! The files of a table directory and the header file's atomic
//! replacement (`docs/sozu-format.md`, "Files").

use super::header::{Header, HeaderError};
use super::storage::Storage;
use super::store::{corrupt, io_err};
use super::SozuError;

/// The header: the base the page files hold.
pub(super) const HEADER_FILE: &str = "sozu.header";
/// The next header, before its atomic rename.
pub(super) const HEADER_TMP: &str = "sozu.header.tmp";

/// The journal of generation `g`: two files used in turn, so the next
/// generation's commits can go on while a checkpoint of this one runs.
pub(super) fn journal_file(g: u64) -> &'static str {
    if g.is_multiple_of(2) {
        "sozu.journal.0"
    } else {
        "sozu.journal.1"
    }
}

/// The checkpoint (double-write) file that makes generation `g` the base:
/// two files used in turn, so a base's file is never rewritten before the
/// next base's header is durable (a table recovered from a checkpoint
/// interrupted during its home writes still needs it until then).
pub(super) fn ckpt_file(g: u64) -> &'static str {
    if g.is_multiple_of(2) {
        "sozu.ckpt.0"
    } else {
        "sozu.ckpt.1"
    }
}

/// Decodes a header image read from `name` at `offset`.
///
/// # Errors
/// [`SozuError::UnsupportedVersion`] or [`SozuError::Corrupt`].
pub(super) fn decode_header(
    st: &dyn Storage,
    name: &str,
    offset: u64,
    b: &[u8],
) -> Result<Header, SozuError> {
    Header::decode(b).map_err(|e| match e {
        HeaderError::Version(major, minor) => SozuError::UnsupportedVersion {
            path: st.path_of(name),
            major,
            minor,
        },
        HeaderError::Checksum => corrupt(st.path_of(name), offset, "header checksum mismatch"),
        HeaderError::Magic => corrupt(
            st.path_of(name),
            offset + 4,
            "bad header magic (not a Sozu table)",
        ),
        HeaderError::Field(f) => corrupt(
            st.path_of(name),
            offset,
            format!("header field out of range: {f}"),
        ),
    })
}

/// Replaces the header file atomically: the tmp file written and synced,
/// renamed over the header, the directory synced.
///
/// # Errors
/// [`SozuError::Io`].
pub(super) fn write_header_file(st: &mut dyn Storage, image: &[u8]) -> Result<(), SozuError> {
    st.set_len(HEADER_TMP, 0)
        .map_err(|e| io_err(st, HEADER_TMP, e))?;
    st.write_at(HEADER_TMP, 0, image)
        .map_err(|e| io_err(st, HEADER_TMP, e))?;
    st.sync(HEADER_TMP).map_err(|e| io_err(st, HEADER_TMP, e))?;
    st.rename(HEADER_TMP, HEADER_FILE)
        .map_err(|e| io_err(st, HEADER_FILE, e))?;
    st.sync_dir().map_err(|e| io_err(st, HEADER_FILE, e))
}
