//! Loading the block index at open: the records of `block_by_id` (blocks
//! with data, or whose status changed) merged by id with the headers of
//! the `headers/` flat files (accepted without their block), which give
//! only the 80-byte header: the parent, height and chainwork are derived
//! from the entries before it (a parent always has a smaller id).

use std::collections::HashMap;

use bitcoin::block::Header;
use bitcoin::pow::Work;
use bitcoin::BlockHash;

use crate::chain::index::{BlockIndex, BlockStatus, IndexEntry};
use crate::chain::ChainParams;
use crate::primitives::BlockId;
use crate::snapshot::BlockMeta;
use crate::store::headers::decode_headers;
use crate::store::{BlockRecord, FlatPos, FlatReader, Store, META_TIP};

use super::PipelineError;

/// The entries being rebuilt, in id order, with a hash → id map for the
/// parents of header-only entries, and the metadata of the ids up to the
/// last record.
struct Loader {
    entries: Vec<IndexEntry>,
    metas: Vec<BlockMeta>,
    ids: HashMap<BlockHash, BlockId>,
}

impl Loader {
    fn expect_next(&self, id: BlockId) -> Result<(), PipelineError> {
        if id.0 as usize != self.entries.len() {
            return Err(PipelineError::Inconsistent {
                reason: format!(
                    "block ids are not dense: id {} follows {} entries",
                    id.0,
                    self.entries.len()
                ),
            });
        }
        Ok(())
    }

    fn push(&mut self, entry: IndexEntry) {
        self.ids.insert(entry.hash, entry.id);
        self.entries.push(entry);
    }

    fn record(&mut self, id: BlockId, r: BlockRecord) -> Result<(), PipelineError> {
        self.expect_next(id)?;
        let entry = IndexEntry {
            id,
            hash: r.header.block_hash(),
            header: r.header,
            height: r.height,
            chainwork: Work::from_be_bytes(r.chainwork),
            status: r.status,
            prev: r.prev,
        };
        let meta = BlockMeta {
            data: r.data,
            filter: r.filter,
            spent: r.spent,
            filter_header: r.filter_header,
            txouts: r.txouts,
            total_sats: r.total_sats,
            tx_count: r.tx_count,
            reject_reason: r.reject_reason,
        };
        // Metadata covers the ids up to the last record (see
        // `Chainstate::ensure_meta`): none for the header-only entries
        // after it.
        self.metas.resize_with(id.0 as usize, BlockMeta::default);
        self.metas.push(meta);
        self.push(entry);
        Ok(())
    }

    fn header_only(&mut self, id: BlockId, header: Header) -> Result<(), PipelineError> {
        self.expect_next(id)?;
        let hash = header.block_hash();
        let parent = self
            .ids
            .get(&header.prev_blockhash)
            .and_then(|p| self.entries.get(p.0 as usize))
            .ok_or_else(|| PipelineError::Inconsistent {
                reason: format!(
                    "header {hash} (id {}) in the headers files has no parent before it",
                    id.0
                ),
            })?;
        let entry = IndexEntry {
            id,
            hash,
            header,
            height: parent.height + 1,
            chainwork: parent.chainwork + header.work(),
            status: BlockStatus::HeadersOnly,
            prev: Some(parent.id),
        };
        self.push(entry);
        Ok(())
    }
}

/// The headers of the `headers/` files up to their committed end, in id
/// order.
fn read_headers(
    reader: &FlatReader,
    end: FlatPos,
) -> Result<Vec<(BlockId, Header)>, PipelineError> {
    let mut out: Vec<(BlockId, Header)> = Vec::new();
    reader.scan(end, &mut |record| -> Result<(), PipelineError> {
        let items = decode_headers(record).map_err(|source| PipelineError::Inconsistent {
            reason: format!("a record of the headers files is damaged: {source}"),
        })?;
        for (id, h) in items {
            if out.last().is_some_and(|(last, _)| last.0 >= id.0) {
                return Err(PipelineError::Inconsistent {
                    reason: format!("the headers files list block id {} out of order", id.0),
                });
            }
            out.push((id, h));
        }
        Ok(())
    })?;
    Ok(out)
}

/// Rebuilds the block index and per-block metadata of a datadir: a new one
/// (no records: genesis alone) or the stored one, its active tip from the
/// tip marker.
///
/// # Errors
/// [`PipelineError::Inconsistent`] when ids are not dense, a header has no
/// parent, or the tip marker is missing; store and flat-file errors;
/// [`PipelineError::Index`] for an inconsistent index.
pub(super) fn load_index(
    params: &ChainParams,
    store: &Store,
    headers: &FlatReader,
    headers_end: FlatPos,
) -> Result<(BlockIndex, imbl::Vector<BlockMeta>), PipelineError> {
    let pending = read_headers(headers, headers_end)?;
    // Header-only entries are most of a large index: sized for them at
    // once rather than grown (and copied) by doubling.
    let mut l = Loader {
        entries: Vec::with_capacity(pending.len() + 1),
        metas: Vec::new(),
        ids: HashMap::with_capacity(pending.len() + 1),
    };
    let mut pending = pending.into_iter().peekable();
    store.trees.block_by_id.for_each(&mut |id: BlockId,
                                            r: BlockRecord|
     -> Result<(), PipelineError> {
        while let Some((h_id, h)) = pending.next_if(|(h_id, _)| h_id.0 <= id.0) {
            // A record of the same id is a later state of that block.
            if h_id != id {
                l.header_only(h_id, h)?;
            }
        }
        l.record(id, r)
    })?;
    for (id, h) in pending {
        l.header_only(id, h)?;
    }
    if l.entries.is_empty() {
        let genesis = BlockMeta {
            filter_header: [0u8; 32],
            tx_count: 1,
            ..Default::default()
        };
        return Ok((BlockIndex::new(params.clone()), imbl::vector![genesis]));
    }
    let tip = store
        .meta(META_TIP)?
        .and_then(|b| <u32 as crate::store::Codec>::decode(&b))
        .map(BlockId)
        .ok_or_else(|| PipelineError::Inconsistent {
            reason: "no tip marker".into(),
        })?;
    let index = BlockIndex::from_entries_and_ids(params.clone(), l.entries, l.ids, tip)?;
    Ok((index, l.metas.into_iter().collect()))
}
