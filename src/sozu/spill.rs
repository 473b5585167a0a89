//! The spill choice (`docs/sozu-format.md`, "Spill policy"): which entries
//! of an overflowing bucket flow down, as a pure function of what the
//! policy looks at.

use super::types::OutPointKey;

/// One entry of an overflowing bucket, as the spill policy sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct SpillEntry {
    /// A spend marker: markers flow before any entry, to meet their
    /// entries below (`docs/sozu-format.md`, "Spend markers").
    pub(super) marker: bool,
    /// Consumed by a block of the best chain (the Sozu paper's first key).
    pub(super) consumed_on_best: bool,
    /// Its highest production height (the Sozu paper's second key: oldest first).
    pub(super) max_height: u32,
    /// Its key (the Sozu paper's third key).
    pub(super) key: OutPointKey,
    /// The child (index within the bucket's group) its hash falls in.
    pub(super) child: usize,
    /// Its encoded length in bytes.
    pub(super) len: usize,
}

/// An overflowing bucket.
#[derive(Clone, Debug)]
pub(super) struct SpillInput<'a> {
    /// Its entries, in page order.
    pub(super) entries: &'a [SpillEntry],
    /// Bytes the bucket keeps: α × capacity.
    pub(super) target: usize,
    /// Children per bucket, 2^g.
    pub(super) fanout: usize,
    /// Bit c set: child c already has a page.
    pub(super) written: u16,
    /// The fewest-children policy (false: the Sozu paper literally, any child).
    pub(super) fewest_children: bool,
    /// The Sozu paper's first key: consumed entries flow first (true) or last.
    pub(super) consumed_first: bool,
}

/// The indices (into `entries`, ascending) of the entries that flow down:
///
/// 1. spend markers first, then the Sozu paper's order — consumed on the best
///    chain first (or last, with `consumed_first` off), then oldest
///    highest production height, then key — give the Sozu paper's spill prefix:
///    the entries it would move until the bucket holds `target` bytes;
///    count that prefix's bytes per child;
/// 2. choose children — those already written first, then by decreasing
///    prefix bytes, then by decreasing bytes in all, then by index — until
///    the chosen children's bytes cover the excess (with
///    `fewest_children` off, every child is chosen);
/// 3. walk the Sozu paper's order again, moving the entries of chosen children
///    until the bucket holds `target` bytes.
pub(super) fn choose(input: &SpillInput<'_>) -> Vec<usize> {
    let e = input.entries;
    let mut order: Vec<usize> = (0..e.len()).collect();
    // The Sozu paper's order, field by field: the key (36 bytes) is compared
    // only on ties of the first two, and never copied.
    order.sort_unstable_by(|&a, &b| {
        let (x, y) = (&e[a], &e[b]);
        // The first key: the entries that flow first sort first.
        let first = |s: &SpillEntry| s.consumed_on_best == input.consumed_first;
        y.marker
            .cmp(&x.marker)
            .then(first(y).cmp(&first(x)))
            .then(x.max_height.cmp(&y.max_height))
            .then_with(|| x.key.cmp(&y.key))
    });
    let total: usize = e.iter().map(|x| x.len).sum();
    let chosen = choose_children(input, &order, total);
    let mut size = total;
    let mut out = Vec::new();
    for &i in &order {
        if size <= input.target {
            break;
        }
        if chosen & (1 << e[i].child) != 0 {
            size -= e[i].len;
            out.push(i);
        }
    }
    out.sort_unstable();
    out
}

/// Step 2: the mask of the children the spill may go to.
fn choose_children(input: &SpillInput<'_>, order: &[usize], total: usize) -> u32 {
    let e = input.entries;
    let fanout = input.fanout.clamp(1, 16);
    if !input.fewest_children {
        return u32::MAX;
    }
    let mut prefix = vec![0usize; fanout];
    let mut bytes = vec![0usize; fanout];
    let mut size = total;
    for &i in order {
        let c = e[i].child.min(fanout - 1);
        bytes[c] += e[i].len;
        if size > input.target {
            size -= e[i].len;
            prefix[c] += e[i].len;
        }
    }
    let mut by_pref: Vec<usize> = (0..fanout).collect();
    let written = |c: usize| input.written & (1 << c) != 0;
    by_pref.sort_unstable_by_key(|&c| {
        (
            !written(c),
            std::cmp::Reverse(prefix[c]),
            std::cmp::Reverse(bytes[c]),
            c,
        )
    });
    let mut chosen = 0u32;
    let mut size = total;
    for c in by_pref {
        if size <= input.target {
            break;
        }
        chosen |= 1 << c;
        size = size.saturating_sub(bytes[c]);
    }
    chosen
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(i: u8, consumed: bool, h: u32, child: usize, len: usize) -> SpillEntry {
        SpillEntry {
            marker: false,
            consumed_on_best: consumed,
            max_height: h,
            key: [i; 36],
            child,
            len,
        }
    }

    fn input(entries: &[SpillEntry], target: usize, written: u16) -> SpillInput<'_> {
        SpillInput {
            entries,
            target,
            fanout: 2,
            written,
            fewest_children: true,
            consumed_first: true,
        }
    }

    /// Step 1: the Sozu paper's order — consumed first, then oldest, then key —
    /// and nothing moves once the bucket is at the target.
    #[test]
    fn seed_order_within_one_child() {
        let e = [
            entry(1, false, 50, 0, 100),
            entry(2, true, 90, 0, 100),
            entry(3, false, 10, 0, 100),
            entry(4, false, 10, 0, 100),
        ];
        // 400 bytes, keep 200: the consumed one, then the oldest by key.
        assert_eq!(choose(&input(&e, 200, 0)), vec![1, 2]);
        assert_eq!(choose(&input(&e, 300, 0)), vec![1]);
        assert_eq!(choose(&input(&e, 400, 0)), Vec::<usize>::new());
        // Consumed last: the two oldest live ones, by key; the consumed
        // one only once every live one has gone.
        let last = SpillInput {
            consumed_first: false,
            ..input(&e, 200, 0)
        };
        assert_eq!(choose(&last), vec![2, 3]);
        let all_but_one = SpillInput {
            target: 100,
            ..last
        };
        assert_eq!(choose(&all_but_one), vec![0, 2, 3]);
    }

    /// Step 2: one child when it covers the excess — the one holding most
    /// of the Sozu paper's prefix — and its younger entries flow before the
    /// other child's older ones.
    #[test]
    fn fewest_children_by_prefix_bytes() {
        let e = [
            entry(1, false, 10, 1, 100), // oldest: in the prefix, child 1
            entry(2, false, 20, 0, 100), // in the prefix, child 0
            entry(3, false, 30, 0, 100), // in the prefix, child 0
            entry(4, false, 40, 0, 100),
            entry(5, false, 50, 1, 100),
        ];
        // Excess 300: prefix = {1 (c1), 2, 3 (c0)}: child 0 holds 200 of it
        // and 300 in all, enough; so 2, 3, 4 move, not the older 1.
        assert_eq!(choose(&input(&e, 200, 0)), vec![1, 2, 3]);
        // With the Sozu paper's literal policy the prefix moves whatever child.
        let literal = SpillInput {
            fewest_children: false,
            ..input(&e, 200, 0)
        };
        assert_eq!(choose(&literal), vec![0, 1, 2]);
    }

    /// Step 1: spend markers flow before everything else, the Sozu paper's
    /// order after them.
    #[test]
    fn markers_flow_first() {
        let mut e = vec![
            entry(1, true, 10, 0, 100),
            entry(2, false, 90, 0, 100),
            entry(3, false, 5, 0, 100),
        ];
        e[1].marker = true;
        assert_eq!(choose(&input(&e, 200, 0)), vec![1]);
        assert_eq!(choose(&input(&e, 100, 0)), vec![0, 1]);
    }

    /// Step 2: a child that already has a page is chosen first, and a
    /// second child is added only when the first cannot take the excess.
    #[test]
    fn written_children_first_then_more() {
        let e = [
            entry(1, false, 10, 0, 100),
            entry(2, false, 20, 0, 100),
            entry(3, false, 30, 1, 100),
            entry(4, false, 40, 0, 100),
        ];
        // Child 1 is written: it is chosen first though child 0 holds the
        // prefix; its 100 bytes cover an excess of 100.
        assert_eq!(choose(&input(&e, 300, 0b10)), vec![2]);
        // An excess of 200: child 1 is not enough, child 0 is added; the
        // seed's order then moves the two oldest.
        assert_eq!(choose(&input(&e, 200, 0b10)), vec![0, 1]);
    }
}
