//! Purge hints: when a page's entries need testing for a hard delete
//! (`docs/sozu-format.md`, "Purge hints").
//!
//! Whether an entry is purgeable ([`super::types::is_purgeable`]) changes
//! only as the tip passes its lifecycle records' heights plus
//! [`PURGE_DEPTH`]. A record at height h is *settled* once h + 100 < tip:
//! its block can no longer enter or leave the best chain (the table
//! refuses writes more than 100 below the tip). An entry that is not
//! purgeable now and whose records are all settled never will be. So each
//! page keeps the lowest tip height at which one of its entries may change
//! its answer, and the writer tests a page's entries only when the tip has
//! reached it: the cost of purging follows the purges, not the pages
//! rewritten.

use super::page::{EntryRef, NO_PURGE};
use super::types::{BlockOracle, PURGE_DEPTH};

/// The tip height from which a record at height `h` may change its
/// entry's purge answer, or `None` if it is settled at tip `tip`.
pub(super) fn record_hint(h: u32, tip: u32) -> Option<u32> {
    (h.saturating_add(PURGE_DEPTH) >= tip)
        .then(|| h.saturating_add(PURGE_DEPTH).max(tip.saturating_add(1)))
}

/// The tip height from which entry `e`, not purgeable at `tip`, may
/// become purgeable ([`NO_PURGE`]: never). Consumption heights come from
/// `oracle` (an unknown block never makes an entry purgeable).
pub(super) fn entry_hint(e: EntryRef<'_>, oracle: &dyn BlockOracle, tip: u32) -> u32 {
    let produced = e.productions().filter_map(|p| record_hint(p.height, tip));
    let consumed = e.consumptions().filter_map(|c| {
        let h = oracle
            .best_height(c.block)
            .or_else(|| oracle.height(c.block))?;
        record_hint(h, tip)
    });
    produced.chain(consumed).min().unwrap_or(NO_PURGE)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settled_records_give_no_hint() {
        // tip 300: a record at 199 is settled (199 + 100 < 300); at 200 it
        // is deep but a reorg at height 200 is still allowed: test again at
        // the next block; at 250 from 350.
        assert_eq!(record_hint(199, 300), None);
        assert_eq!(record_hint(200, 300), Some(301));
        assert_eq!(record_hint(250, 300), Some(350));
        assert_eq!(record_hint(u32::MAX, 5), Some(u32::MAX));
    }
}
