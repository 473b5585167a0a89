//! BIP-158 basic filters of blocks as the pipeline receives them (any
//! block that decodes) with arbitrary spent-output scripts: building the
//! filter never panics, and every element BIP-158 puts in it matches (no
//! false negative: a light client would miss a payment).
//!
//! Input: byte 0 = number of spent scripts k, then k scripts (length byte,
//! bytes), then the block. The scripts are reused in turn for every
//! non-coinbase input (the filter needs one per input).
#![no_main]

use bitcoin::consensus::encode::deserialize_partial;
use bitcoin::Block;
use kakehi::filters::basic_filter;
use libfuzzer_sys::fuzz_target;

/// The fuzzed scripts and the block after them.
fn split(data: &[u8]) -> Option<(Vec<Vec<u8>>, &[u8])> {
    let (&k, mut rest) = data.split_first()?;
    let mut scripts = Vec::with_capacity(k as usize);
    for _ in 0..k {
        let (&len, tail) = rest.split_first()?;
        let script = tail.get(..len as usize)?;
        scripts.push(script.to_vec());
        rest = &tail[len as usize..];
    }
    Some((scripts, rest))
}

fuzz_target!(|data: &[u8]| {
    let Some((scripts, rest)) = split(data) else {
        return;
    };
    let Ok((block, _)) = deserialize_partial::<Block>(rest) else {
        return;
    };
    let inputs: usize = block.txdata.iter().skip(1).map(|t| t.input.len()).sum();
    if inputs > 10_000 {
        return;
    }
    let spent: Vec<&[u8]> = (0..inputs)
        .map(|i| scripts.get(i % scripts.len().max(1)).map_or(&[][..], |s| s.as_slice()))
        .collect();
    let filter = basic_filter(&block, spent.iter().copied()).expect("one script per input");
    let mut elements: Vec<&[u8]> = block
        .txdata
        .iter()
        .flat_map(|t| t.output.iter())
        .map(|o| o.script_pubkey.as_bytes())
        .filter(|s| !s.is_empty() && s[0] != 0x6a)
        .collect();
    elements.extend(spent.iter().copied().filter(|s| !s.is_empty()));
    let hash = block.block_hash();
    if !elements.is_empty() {
        let all = filter
            .match_all(&hash, &mut elements.iter().copied())
            .expect("our own filter decodes");
        assert!(all, "an element of the block is missing from its filter");
    }
});
