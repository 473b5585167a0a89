//! Page edits: what the writer does to pages, byte for byte, and what the
//! journal records of it (`docs/sozu-format.md`, "Journal").
//!
//! Every change the writer makes to a page goes through [`OpLog::apply`]:
//! the edit is encoded into the shard's log *and* applied by [`apply`],
//! the one function journal replay also uses. So replaying a commit's ops
//! on the pages as they were at the previous commit gives exactly the
//! pages the writer had — by construction, not by a second implementation.
//! Edits name entries by slot (their position in the page), and a spill
//! names the entries it moves by slot instead of repeating their bytes.

use std::borrow::Cow;

use super::geo::Addr;
use super::header::MAX_LAYERS;
use super::page::{self, PageError, CONSUMPTION_LEN, PRODUCTION_LEN};

/// One edit of a page.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Op<'a> {
    /// The following ops apply to this page.
    Page(Addr),
    /// The current page becomes an empty page (its first write).
    Init,
    /// Sets the current page's descent and purge fields.
    Head {
        max_child_height: u32,
        purge_hint: u32,
        /// Group + 1 in bits 0..48, written-children mask above.
        children: u64,
    },
    /// Appends one encoded entry.
    Insert(&'a [u8]),
    /// Adds a production record to entry `slot`.
    Produce {
        slot: u16,
        record: [u8; PRODUCTION_LEN],
    },
    /// Adds a consumption record to entry `slot`.
    Consume {
        slot: u16,
        record: [u8; CONSUMPTION_LEN],
    },
    /// Removes entries (purged), slots ascending.
    Delete(Cow<'a, [u16]>),
    /// Moves entries (slots ascending) to the end of child page `child` of
    /// the next layer, creating it first if `init`, and sets that child's
    /// purge hint.
    Spill {
        child: u64,
        init: bool,
        child_hint: u32,
        slots: Cow<'a, [u16]>,
    },
    /// Points entry `slot`'s out-of-line script at `location`.
    Locate { slot: u16, location: u64 },
}

const PAGE: u8 = 1;
const INIT: u8 = 2;
const HEAD: u8 = 3;
const INSERT: u8 = 4;
const PRODUCE: u8 = 5;
const CONSUME: u8 = 6;
const DELETE: u8 = 7;
const SPILL: u8 = 8;
const LOCATE: u8 = 9;

fn put_slots(out: &mut Vec<u8>, slots: &[u16]) {
    out.extend_from_slice(&(slots.len() as u16).to_le_bytes());
    for s in slots {
        out.extend_from_slice(&s.to_le_bytes());
    }
}

/// Appends the encoding of `op` to `out`.
pub(super) fn encode(op: &Op<'_>, out: &mut Vec<u8>) {
    match op {
        Op::Page((layer, page)) => {
            out.extend_from_slice(&[PAGE, *layer]);
            out.extend_from_slice(&page.to_le_bytes());
        }
        Op::Init => out.push(INIT),
        Op::Head {
            max_child_height,
            purge_hint,
            children,
        } => {
            out.push(HEAD);
            out.extend_from_slice(&max_child_height.to_le_bytes());
            out.extend_from_slice(&purge_hint.to_le_bytes());
            out.extend_from_slice(&children.to_le_bytes());
        }
        Op::Insert(entry) => {
            out.push(INSERT);
            out.extend_from_slice(entry);
        }
        Op::Produce { slot, record } => {
            out.push(PRODUCE);
            out.extend_from_slice(&slot.to_le_bytes());
            out.extend_from_slice(record);
        }
        Op::Consume { slot, record } => {
            out.push(CONSUME);
            out.extend_from_slice(&slot.to_le_bytes());
            out.extend_from_slice(record);
        }
        Op::Delete(slots) => {
            out.push(DELETE);
            put_slots(out, slots);
        }
        Op::Spill {
            child,
            init,
            child_hint,
            slots,
        } => {
            out.push(SPILL);
            out.extend_from_slice(&child.to_le_bytes());
            out.push(u8::from(*init));
            out.extend_from_slice(&child_hint.to_le_bytes());
            put_slots(out, slots);
        }
        Op::Locate { slot, location } => {
            out.push(LOCATE);
            out.extend_from_slice(&slot.to_le_bytes());
            out.extend_from_slice(&location.to_le_bytes());
        }
    }
}

/// Why an op stream does not decode or apply.
#[derive(Debug, thiserror::Error)]
pub(super) enum OpError {
    /// The bytes are not an op.
    #[error("op at byte {at}: {what}")]
    Decode { at: usize, what: &'static str },
    /// An op that needs a current page came before any `Page` op.
    #[error("page edit before any page was named")]
    NoPage,
    /// The edit does not fit the page it names.
    #[error("layer {} page {}: {source}", addr.0, addr.1)]
    Page {
        addr: Addr,
        #[source]
        source: PageError,
    },
    /// Loading the page failed.
    #[error(transparent)]
    Load(#[from] Box<super::SozuError>),
}

struct Cursor<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], OpError> {
        let s = self
            .b
            .get(self.at..self.at.saturating_add(n))
            .ok_or(OpError::Decode {
                at: self.at,
                what: "op overruns its record",
            })?;
        self.at += n;
        Ok(s)
    }
    fn array<const N: usize>(&mut self) -> Result<[u8; N], OpError> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }
    fn u16(&mut self) -> Result<u16, OpError> {
        Ok(u16::from_le_bytes(self.array()?))
    }
    fn u32(&mut self) -> Result<u32, OpError> {
        Ok(u32::from_le_bytes(self.array()?))
    }
    fn u64(&mut self) -> Result<u64, OpError> {
        Ok(u64::from_le_bytes(self.array()?))
    }
    fn slots(&mut self) -> Result<Cow<'a, [u16]>, OpError> {
        let n = self.u16()? as usize;
        let raw = self.take(2 * n)?;
        Ok(Cow::Owned(
            raw.chunks_exact(2)
                .map(|c| u16::from_le_bytes([c[0], c[1]]))
                .collect(),
        ))
    }
}

/// Decodes the op at `at` of `b`; returns it and the offset after it.
pub(super) fn decode(b: &[u8], at: usize) -> Result<(Op<'_>, usize), OpError> {
    let mut c = Cursor { b, at };
    let kind = c.array::<1>()?[0];
    let op = match kind {
        PAGE => {
            let layer = c.array::<1>()?[0];
            Op::Page((layer, c.u64()?))
        }
        INIT => Op::Init,
        HEAD => Op::Head {
            max_child_height: c.u32()?,
            purge_hint: c.u32()?,
            children: c.u64()?,
        },
        INSERT => {
            let len = page::entry_len(b, c.at).map_err(|_| OpError::Decode {
                at: c.at,
                what: "inserted entry overruns its record",
            })?;
            Op::Insert(c.take(len)?)
        }
        PRODUCE => Op::Produce {
            slot: c.u16()?,
            record: c.array()?,
        },
        CONSUME => Op::Consume {
            slot: c.u16()?,
            record: c.array()?,
        },
        DELETE => Op::Delete(c.slots()?),
        SPILL => {
            let child = c.u64()?;
            let flags = c.array::<1>()?[0];
            if flags > 1 {
                return Err(OpError::Decode {
                    at: c.at - 1,
                    what: "unknown spill flags",
                });
            }
            Op::Spill {
                child,
                init: flags == 1,
                child_hint: c.u32()?,
                slots: c.slots()?,
            }
        }
        LOCATE => Op::Locate {
            slot: c.u16()?,
            location: c.u64()?,
        },
        _ => {
            return Err(OpError::Decode {
                at,
                what: "unknown op",
            })
        }
    };
    Ok((op, c.at))
}

/// The pages an op stream edits: the writer's page store, or the replay's
/// image map.
pub(super) trait Pages {
    /// The page at `addr` for editing (loaded, and copied on write, as the
    /// store needs).
    ///
    /// # Errors
    /// The page cannot be loaded (storage, corruption, no such page).
    fn edit(&mut self, addr: Addr) -> Result<&mut Vec<u8>, super::SozuError>;
    /// `addr` as a new empty page.
    ///
    /// # Errors
    /// As [`Pages::edit`].
    fn create(&mut self, addr: Addr) -> Result<&mut Vec<u8>, super::SozuError>;
}

fn edit_err(addr: Addr) -> impl Fn(PageError) -> OpError {
    move |source| OpError::Page { addr, source }
}

/// Applies `op` to `pages`; `cur` is the current page (set by `Page`).
/// `at`, when given, is the byte offset of the entry a `Produce` or
/// `Consume` names (the writer knows it; replay finds it by slot).
///
/// # Errors
/// [`OpError`]: no current page, an edit the page cannot take, a page
/// that cannot be loaded.
pub(super) fn apply(
    pages: &mut dyn Pages,
    cur: &mut Option<Addr>,
    op: &Op<'_>,
    at: Option<usize>,
) -> Result<(), OpError> {
    if let Op::Page(addr) = op {
        *cur = Some(*addr);
        return Ok(());
    }
    let addr = cur.ok_or(OpError::NoPage)?;
    let err = edit_err(addr);
    let load = |e: super::SozuError| OpError::Load(Box::new(e));
    match op {
        Op::Page(_) => {}
        Op::Init => {
            pages.create(addr).map_err(load)?;
        }
        Op::Head {
            max_child_height,
            purge_hint,
            children,
        } => {
            let p = pages.edit(addr).map_err(load)?;
            page::set_head(p, *max_child_height, *purge_hint, *children).map_err(err)?;
        }
        Op::Insert(entry) => page::append(pages.edit(addr).map_err(load)?, entry).map_err(err)?,
        Op::Produce { slot, record } => {
            page::insert_production(pages.edit(addr).map_err(load)?, (*slot, at), record)
                .map_err(err)?;
        }
        Op::Consume { slot, record } => {
            page::insert_consumption(pages.edit(addr).map_err(load)?, (*slot, at), record)
                .map_err(err)?;
        }
        Op::Delete(slots) => {
            page::remove(pages.edit(addr).map_err(load)?, slots).map_err(err)?;
        }
        Op::Spill {
            child,
            init,
            child_hint,
            slots,
        } => spill(pages, addr, (*child, *init, *child_hint), slots)?,
        Op::Locate { slot, location } => {
            page::set_location(pages.edit(addr).map_err(load)?, *slot, *location).map_err(err)?;
        }
    }
    Ok(())
}

/// The `Spill` op: entries `slots` leave page `from` for the end of its
/// child page, whose purge hint becomes `hint`.
fn spill(
    pages: &mut dyn Pages,
    from: Addr,
    (child, init, hint): (u64, bool, u32),
    slots: &[u16],
) -> Result<(), OpError> {
    let load = |e: super::SozuError| OpError::Load(Box::new(e));
    if from.0 as usize + 1 >= MAX_LAYERS {
        return Err(OpError::Decode {
            at: 0,
            what: "spill below the deepest layer",
        });
    }
    let moved = page::remove(pages.edit(from).map_err(load)?, slots).map_err(edit_err(from))?;
    let to = (from.0 + 1, child);
    let dest = if init {
        pages.create(to).map_err(load)?
    } else {
        pages.edit(to).map_err(load)?
    };
    page::arrive_all(dest, &moved).map_err(edit_err(to))?;
    let h = page::head(dest);
    page::set_head(dest, h.max_child_height, hint, h.children_field()).map_err(edit_err(to))
}

/// A shard's ops since its last commit, and the page they apply to.
#[derive(Debug, Default)]
pub(super) struct OpLog {
    bytes: Vec<u8>,
    cur: Option<Addr>,
}

impl OpLog {
    /// Encodes `op` into the log and applies it to `pages` (a `Page` op is
    /// logged only when it changes the current page).
    ///
    /// # Errors
    /// As [`apply`].
    pub(super) fn apply(&mut self, pages: &mut dyn Pages, op: Op<'_>) -> Result<(), OpError> {
        self.apply_at(pages, op, None)
    }

    /// [`OpLog::apply`] with the byte offset of the entry the op names.
    ///
    /// # Errors
    /// As [`apply`].
    pub(super) fn apply_at(
        &mut self,
        pages: &mut dyn Pages,
        op: Op<'_>,
        at: Option<usize>,
    ) -> Result<(), OpError> {
        if let Op::Page(addr) = op {
            if self.cur == Some(addr) {
                return Ok(());
            }
        }
        let mut cur = self.cur;
        apply(pages, &mut cur, &op, at)?;
        encode(&op, &mut self.bytes);
        self.cur = cur;
        Ok(())
    }
    /// The encoded ops.
    #[cfg(test)]
    pub(super) fn bytes(&self) -> &[u8] {
        &self.bytes
    }
    /// The encoded ops, taken for a commit; the next commit's log starts.
    pub(super) fn take(&mut self) -> Vec<u8> {
        self.cur = None;
        std::mem::take(&mut self.bytes)
    }
}

/// Applies a whole encoded op stream to `pages`; with `disk_from` =
/// `Some(L)`, only its edits of the layers above L (`docs/sozu-format.md`,
/// "Checkpoints of the disk layers": the page files of layers ≥ L already
/// hold the state these ops lead to). Entries only move down, so the
/// pages above L never depend on those below: a `Spill` from layer L − 1
/// only removes its slots from the parent.
///
/// # Errors
/// [`OpError`] with the byte offset of a bad op.
pub(super) fn replay(
    pages: &mut dyn Pages,
    b: &[u8],
    disk_from: Option<u8>,
) -> Result<(), OpError> {
    let mut cur = None;
    let mut at = 0;
    while at < b.len() {
        let (op, next) = decode(b, at)?;
        let below = |a: Addr, by: u8| disk_from.is_some_and(|l| a.0.saturating_add(by) >= l);
        let r = match (cur, &op) {
            (_, Op::Page(_)) | (None, _) => apply(pages, &mut cur, &op, None),
            (Some(a), _) if below(a, 0) => Ok(()),
            (Some(a), Op::Spill { slots, .. }) if below(a, 1) => pages
                .edit(a)
                .map_err(|e| OpError::Load(Box::new(e)))
                .and_then(|p| page::remove(p, slots).map(drop).map_err(edit_err(a))),
            _ => apply(pages, &mut cur, &op, None),
        };
        r.map_err(|e| match e {
            OpError::Decode { what, .. } => OpError::Decode { at, what },
            other => other,
        })?;
        at = next;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustc_hash::FxHashMap;

    #[derive(Default)]
    struct Map(FxHashMap<Addr, Vec<u8>>);
    impl Pages for Map {
        fn edit(&mut self, addr: Addr) -> Result<&mut Vec<u8>, super::super::SozuError> {
            self.0
                .get_mut(&addr)
                .ok_or(super::super::SozuError::Poisoned)
        }
        fn create(&mut self, addr: Addr) -> Result<&mut Vec<u8>, super::super::SozuError> {
            self.0.insert(addr, page::new_page());
            self.edit(addr)
        }
    }

    fn entry(i: u8, nc: usize) -> Vec<u8> {
        let mut e = vec![i; 36];
        e.extend_from_slice(&[0; 12]);
        e.extend_from_slice(&[0, 1, nc as u8, 2, 0, 0x51, 0x52]);
        e.extend_from_slice(&[3, 0, 0, 0, 7, 0, 0, 0]);
        for k in 0..nc {
            e.extend_from_slice(&[k as u8; 40]);
        }
        e
    }

    /// The writer's log, replayed on the pages it started from, gives the
    /// writer's pages byte for byte: inserts, records added in order,
    /// deletes, a spill into a new child, a header change.
    #[test]
    fn replaying_the_log_gives_the_same_pages() {
        let mut writer = Map::default();
        writer.0.insert((0, 3), page::new_page());
        let start = writer.0.clone();
        let mut log = OpLog::default();
        let ops = vec![
            Op::Page((0, 3)),
            Op::Insert(&[]),
            Op::Insert(&[]),
            Op::Insert(&[]),
        ];
        let entries = [entry(1, 0), entry(2, 1), entry(3, 0)];
        for (i, op) in ops.into_iter().enumerate() {
            let op = match op {
                Op::Insert(_) => Op::Insert(&entries[i - 1]),
                o => o,
            };
            log.apply(&mut writer, op).unwrap();
        }
        let mut rec = [9u8; 40];
        rec[0] = 0;
        log.apply(
            &mut writer,
            Op::Consume {
                slot: 1,
                record: rec,
            },
        )
        .unwrap();
        log.apply(
            &mut writer,
            Op::Consume {
                slot: 1,
                record: [0xff; 40],
            },
        )
        .unwrap();
        log.apply(
            &mut writer,
            Op::Produce {
                slot: 0,
                record: [1, 0, 0, 0, 9, 0, 0, 0],
            },
        )
        .unwrap();
        log.apply(
            &mut writer,
            Op::Spill {
                child: 5,
                init: true,
                child_hint: 140,
                slots: Cow::Borrowed(&[0, 2]),
            },
        )
        .unwrap();
        log.apply(
            &mut writer,
            Op::Head {
                max_child_height: 9,
                purge_hint: 100,
                children: 3 | 1 << 48,
            },
        )
        .unwrap();
        log.apply(&mut writer, Op::Page((1, 5))).unwrap();
        log.apply(&mut writer, Op::Delete(Cow::Borrowed(&[1])))
            .unwrap();
        let mut replayed = Map(start);
        replay(&mut replayed, log.bytes(), None).unwrap();
        assert_eq!(replayed.0, writer.0);
        let parent = &writer.0[&(0, 3)];
        assert_eq!(page::head(parent).count, 1);
        assert_eq!(page::entries(parent).next().unwrap().1.nc(), 3);
        let child = &writer.0[&(1, 5)];
        assert_eq!(page::head(child).purge_hint, 140);
        assert_eq!(page::head(child).count, 1);
        page::validate(parent).unwrap();
        page::validate(child).unwrap();
        // Replayed for the layers above 1 only: the parent as the writer
        // left it (its spilled slots gone), the child not touched, not even
        // loaded (a disk page's file already holds its state).
        let mut above = Map::default();
        above.0.insert((0, 3), page::new_page());
        replay(&mut above, log.bytes(), Some(1)).unwrap();
        assert_eq!(above.0.len(), 1);
        assert_eq!(above.0[&(0, 3)], writer.0[&(0, 3)]);
    }

    #[test]
    fn bad_ops_are_errors_not_panics() {
        let mut m = Map::default();
        assert!(matches!(
            replay(&mut m, &[INSERT, 1, 2], None),
            Err(OpError::Decode { .. })
        ));
        assert!(matches!(
            replay(&mut m, &[INIT], None),
            Err(OpError::NoPage)
        ));
        assert!(matches!(
            replay(&mut m, &[0xee], None),
            Err(OpError::Decode { .. })
        ));
        let mut b = Vec::new();
        encode(&Op::Page((0, 0)), &mut b);
        encode(&Op::Init, &mut b);
        encode(&Op::Delete(Cow::Borrowed(&[4])), &mut b);
        assert!(matches!(
            replay(&mut m, &b, None),
            Err(OpError::Page { .. })
        ));
        for cut in 0..b.len() {
            let _ = replay(&mut Map::default(), &b[..cut], None);
        }
    }
}
