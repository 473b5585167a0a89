//! Page summaries (RAM only): for every disk-layer page, its descent
//! fields and its entries' sorted 16-bit key signatures, so a lookup reads
//! a page only when it may hold the key (`docs/sozu-format.md`, "Page
//! summaries"). They describe *committed* images, so the writer and every
//! concurrent reader can trust them; the writer searches its uncommitted
//! pages directly.

use super::geo::{Addr, Descent, SignatureKey};
use super::page;

/// Page numbers past this are not summarized (a lookup then reads the
/// page): bounds the per-layer vectors whatever a damaged field says.
const MAX_SUMMARIZED_PAGE: u64 = 1 << 28;

/// What a lookup needs of a page without reading it.
#[derive(Debug, Clone)]
pub(super) struct PageSummary {
    pub(super) descent: Descent,
    signatures: Box<[u16]>,
}

impl PageSummary {
    /// The summary of a page in memory form.
    pub(super) fn of(p: &[u8], key: &SignatureKey) -> Self {
        let mut signatures: Box<[u16]> = page::entries(p)
            .map(|(_, e)| key.signature(e.key()))
            .collect();
        signatures.sort_unstable();
        Self {
            descent: Descent::of(&page::head(p)),
            signatures,
        }
    }
    /// Whether the page may hold a key of signature `sig`.
    pub(super) fn may_hold(&self, sig: u16) -> bool {
        self.signatures.binary_search(&sig).is_ok()
    }
    /// Bytes of memory it takes (slot and signatures).
    fn bytes(&self) -> usize {
        std::mem::size_of::<Option<Self>>() + 2 * self.signatures.len()
    }
}

/// The summaries of one shard, by layer and page number.
#[derive(Debug, Default)]
pub(super) struct Summaries {
    layers: Vec<Vec<Option<PageSummary>>>,
    bytes: usize,
}

impl Summaries {
    pub(super) fn get(&self, (layer, page): Addr) -> Option<&PageSummary> {
        self.layers
            .get(layer as usize)?
            .get(usize::try_from(page).ok()?)?
            .as_ref()
    }
    pub(super) fn contains(&self, addr: Addr) -> bool {
        self.get(addr).is_some()
    }
    pub(super) fn set(&mut self, (layer, page): Addr, s: PageSummary) {
        if page >= MAX_SUMMARIZED_PAGE {
            return;
        }
        let layer = layer as usize;
        if self.layers.len() <= layer {
            self.layers.resize_with(layer + 1, Vec::new);
        }
        let v = &mut self.layers[layer];
        let i = page as usize;
        if v.len() <= i {
            v.resize_with(i + 1, || None);
        }
        self.bytes += s.bytes();
        if let Some(old) = v[i].replace(s) {
            self.bytes -= old.bytes();
        }
    }
    /// Bytes of memory the summaries take (estimated).
    pub(super) fn bytes(&self) -> usize {
        self.bytes
            + self
                .layers
                .iter()
                .map(|l| l.capacity() * std::mem::size_of::<Option<PageSummary>>())
                .sum::<usize>()
    }
    /// Signature check of `sigs` against page `addr`'s summary: `None`
    /// when the page has none (it must be read); else its descent fields,
    /// with `may[i]` set to whether the page may hold `sigs[i]`.
    pub(super) fn check(&self, addr: Addr, sigs: &[u16], may: &mut Vec<bool>) -> Option<Descent> {
        let s = self.get(addr)?;
        may.clear();
        may.extend(sigs.iter().map(|&g| s.may_hold(g)));
        Some(s.descent)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_replace_and_check() {
        let key = SignatureKey::new(&siphasher::sip::SipHasher24::new_with_key(&[1; 16]));
        let mut p = page::new_page();
        let mut e = vec![7u8; 36];
        e.extend_from_slice(&[0; 12]);
        e.extend_from_slice(&[0, 1, 0, 0, 0]);
        e.extend_from_slice(&[1, 0, 0, 0, 2, 0, 0, 0]);
        page::append(&mut p, &e).unwrap();
        let mut s = Summaries::default();
        s.set((3, 9), PageSummary::of(&p, &key));
        let sig = key.signature(&e[..36]);
        let mut may = Vec::new();
        assert!(s.check((3, 9), &[sig, sig ^ 1], &mut may).is_some());
        assert_eq!(may, vec![true, false]);
        assert!(s.check((3, 8), &[sig], &mut may).is_none());
        let before = s.bytes;
        s.set((3, 9), PageSummary::of(&page::new_page(), &key));
        assert_eq!(s.bytes, before - 2);
        s.set((3, MAX_SUMMARIZED_PAGE), PageSummary::of(&p, &key));
        assert!(!s.contains((3, MAX_SUMMARIZED_PAGE)));
    }
}
