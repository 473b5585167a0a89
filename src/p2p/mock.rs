//! In-memory [`NodeBackend`] for the P2P tests: real blocks from
//! `testnet-data/regtest-a/blocks.dat`, real filters from `filters.json` and
//! `stale_filters.json`, no validation beyond linking headers (work is
//! summed from each header's target, ties keep the first seen).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

use bitcoin::bip158::{FilterHash, FilterHeader};
use bitcoin::block::Header;
use bitcoin::consensus::{deserialize, serialize};
use bitcoin::hashes::Hash;
use bitcoin::hex::FromHex;
use bitcoin::{Block, BlockHash, Network, Work};

use super::backend::*;
use crate::chain::ChainParams;

/// The regtest-a data set, parsed once per test binary.
pub struct Dataset {
    /// Blocks in file order (genesis excluded), serialized with witness.
    pub blocks: Vec<(BlockHash, Vec<u8>)>,
    /// Best-chain hashes by height (genesis at 0), from chain.json.
    pub best_chain: Vec<BlockHash>,
    /// Stale blocks: hash → height, from chain.json.
    pub stale: Vec<(BlockHash, u32)>,
    /// Filter (bytes) and filter header per block hash, best and stale.
    pub filters: HashMap<BlockHash, (Vec<u8>, FilterHeader)>,
}

fn data_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("testnet-data/regtest-a")
}

fn hex(s: &str) -> Vec<u8> {
    Vec::<u8>::from_hex(s).expect("filters.json holds hex")
}

/// Loads (once) and returns the regtest-a data set.
pub fn dataset() -> Arc<Dataset> {
    static DATA: OnceLock<Arc<Dataset>> = OnceLock::new();
    DATA.get_or_init(|| {
        let raw = std::fs::read(data_dir().join("blocks.dat")).expect("blocks.dat");
        let mut blocks = Vec::new();
        let mut pos = 0;
        while pos + 8 <= raw.len() {
            assert_eq!(
                &raw[pos..pos + 4],
                &[0xfa, 0xbf, 0xb5, 0xda],
                "blk magic at {pos}"
            );
            let len = u32::from_le_bytes(raw[pos + 4..pos + 8].try_into().unwrap()) as usize;
            let bytes = raw[pos + 8..pos + 8 + len].to_vec();
            let header: Header = deserialize(&bytes[..80]).unwrap();
            blocks.push((header.block_hash(), bytes));
            pos += 8 + len;
        }
        let chain: serde_json::Value =
            serde_json::from_slice(&std::fs::read(data_dir().join("chain.json")).unwrap()).unwrap();
        let genesis: BlockHash = chain["genesis"].as_str().unwrap().parse().unwrap();
        let mut best = vec![(0u32, genesis)];
        let mut stale = Vec::new();
        for b in chain["blocks"].as_array().unwrap() {
            let hash: BlockHash = b["hash"].as_str().unwrap().parse().unwrap();
            let height = b["height"].as_u64().unwrap() as u32;
            if b["on_best_chain"].as_bool().unwrap() {
                best.push((height, hash));
            } else {
                stale.push((hash, height));
            }
        }
        best.sort();
        let best_chain: Vec<BlockHash> = best.iter().map(|(_, h)| *h).collect();
        let mut filters = HashMap::new();
        for file in ["filters.json", "stale_filters.json"] {
            let v: serde_json::Value =
                serde_json::from_slice(&std::fs::read(data_dir().join(file)).unwrap()).unwrap();
            for f in v.as_array().unwrap() {
                let hash: BlockHash = f["hash"].as_str().unwrap().parse().unwrap();
                let header: FilterHeader = f["filter_header"].as_str().unwrap().parse().unwrap();
                filters.insert(hash, (hex(f["basic_filter"].as_str().unwrap()), header));
            }
        }
        Arc::new(Dataset {
            blocks,
            best_chain,
            stale,
            filters,
        })
    })
    .clone()
}

struct Entry {
    height: u32,
    header: Header,
    work: Work,
}

struct State {
    headers: HashMap<BlockHash, Entry>,
    blocks: HashMap<BlockHash, Vec<u8>>,
    best_header: BlockHash,
    /// Active chain, by height.
    active: Vec<BlockHash>,
    filters: HashMap<BlockHash, (Vec<u8>, FilterHeader)>,
    filters_synced: bool,
    submitted: usize,
}

/// The mock node.
pub struct MockBackend {
    params: ChainParams,
    state: Mutex<State>,
}

impl MockBackend {
    /// A node with only the regtest genesis block.
    pub fn genesis_only() -> Self {
        let params = ChainParams::new(Network::Regtest);
        let genesis = params.genesis_block();
        let hash = genesis.block_hash();
        let mut headers = HashMap::new();
        headers.insert(
            hash,
            Entry {
                height: 0,
                header: genesis.header,
                work: genesis.header.work(),
            },
        );
        let mut blocks = HashMap::new();
        blocks.insert(hash, serialize(&genesis));
        MockBackend {
            params,
            state: Mutex::new(State {
                headers,
                blocks,
                best_header: hash,
                active: vec![hash],
                filters: HashMap::new(),
                filters_synced: false,
                submitted: 0,
            }),
        }
    }

    /// A node holding all of regtest-a (stale branches included) and its
    /// filters.
    pub fn regtest_a() -> Self {
        let data = dataset();
        let node = Self::genesis_only();
        for (_, bytes) in &data.blocks {
            let block: Block = deserialize(bytes).unwrap();
            node.accept_headers(&[block.header]).unwrap();
            node.submit_block(block).unwrap();
        }
        {
            let mut s = node.state.lock().unwrap();
            s.filters = data.filters.clone();
            s.filters_synced = true;
            s.submitted = 0;
        }
        assert_eq!(node.tip().1, *data.best_chain.last().unwrap());
        node
    }

    /// A node holding the first `n` blocks of blocks.dat (file order, so
    /// the data set's reorgs replay as more are loaded) and all filters.
    pub fn regtest_a_prefix(n: usize) -> Self {
        let node = Self::genesis_only();
        node.load_blocks(0..n);
        {
            let mut s = node.state.lock().unwrap();
            s.filters = dataset().filters.clone();
            s.filters_synced = true;
            s.submitted = 0;
        }
        node
    }

    /// Accepts and stores blocks `range` of blocks.dat (file order).
    pub fn load_blocks(&self, range: std::ops::Range<usize>) {
        let data = dataset();
        for (_, bytes) in &data.blocks[range] {
            let block: Block = deserialize(bytes).unwrap();
            self.accept_headers(&[block.header]).unwrap();
            self.submit_block(block).unwrap();
        }
    }

    /// Replaces the network's DNS seeds and default port (for seeding
    /// tests against `localhost`).
    pub fn with_dns_seeds(mut self, seeds: &'static [&'static str], port: u16) -> Self {
        self.params.dns_seeds = seeds;
        self.params.p2p_port = port;
        self
    }

    /// Number of blocks submitted since creation (or since loading).
    pub fn submitted(&self) -> usize {
        self.state.lock().unwrap().submitted
    }

    fn ancestor(s: &State, mut hash: BlockHash, height: u32) -> Option<BlockHash> {
        loop {
            let e = s.headers.get(&hash)?;
            if e.height == height {
                return Some(hash);
            }
            if e.height < height {
                return None;
            }
            hash = e.header.prev_blockhash;
        }
    }

    /// Hashes of `stop`'s branch from `start` to stop's height.
    fn branch(s: &State, start: u32, stop: BlockHash) -> Result<Vec<BlockHash>, FilterQueryError> {
        let stop_height = s
            .headers
            .get(&stop)
            .ok_or(FilterQueryError::UnknownStop { stop })?
            .height;
        if start > stop_height {
            return Err(FilterQueryError::StartAboveStop {
                start_height: start,
                stop_height,
            });
        }
        let mut out = Vec::with_capacity((stop_height - start + 1) as usize);
        let mut h = stop;
        loop {
            out.push(h);
            let e = &s.headers[&h];
            if e.height == start {
                break;
            }
            h = e.header.prev_blockhash;
        }
        out.reverse();
        Ok(out)
    }

    fn recompute_active(s: &mut State) {
        let mut chain = Vec::new();
        let mut h = s.best_header;
        while let Some(e) = s.headers.get(&h) {
            chain.push(h);
            if e.height == 0 {
                break;
            }
            h = e.header.prev_blockhash;
        }
        chain.reverse();
        let have = chain
            .iter()
            .take_while(|h| s.blocks.contains_key(*h))
            .count();
        chain.truncate(have);
        s.active = chain;
    }
}

impl NodeBackend for MockBackend {
    fn params(&self) -> &ChainParams {
        &self.params
    }

    fn tip(&self) -> (u32, BlockHash) {
        let s = self.state.lock().unwrap();
        ((s.active.len() - 1) as u32, *s.active.last().unwrap())
    }

    fn best_header_tip(&self) -> (u32, BlockHash) {
        let s = self.state.lock().unwrap();
        (s.headers[&s.best_header].height, s.best_header)
    }

    fn block_height(&self, hash: &BlockHash) -> Option<u32> {
        self.state
            .lock()
            .unwrap()
            .headers
            .get(hash)
            .map(|e| e.height)
    }

    fn locator(&self) -> Vec<BlockHash> {
        let s = self.state.lock().unwrap();
        let top = s.headers[&s.best_header].height;
        let mut out = Vec::new();
        let mut step = 1u32;
        let mut height = top as i64;
        while height > 0 {
            if let Some(h) = Self::ancestor(&s, s.best_header, height as u32) {
                out.push(h);
            }
            if out.len() >= 10 {
                step *= 2;
            }
            height -= step as i64;
        }
        out.push(s.active[0]);
        out
    }

    fn headers_after(&self, locator: &[BlockHash], stop: BlockHash, max: usize) -> Vec<Header> {
        let s = self.state.lock().unwrap();
        let start = locator
            .iter()
            .find_map(|h| {
                let e = s.headers.get(h)?;
                (s.active.get(e.height as usize) == Some(h)).then_some(e.height + 1)
            })
            .unwrap_or(1);
        let mut out = Vec::new();
        for h in s.active.iter().skip(start as usize).take(max) {
            out.push(s.headers[h].header);
            if *h == stop {
                break;
            }
        }
        out
    }

    fn header(&self, hash: &BlockHash) -> Option<Header> {
        let s = self.state.lock().unwrap();
        let e = s.headers.get(hash)?;
        let active = s.active.get(e.height as usize) == Some(hash);
        (active || s.blocks.contains_key(hash)).then_some(e.header)
    }

    fn block_bytes(&self, hash: &BlockHash) -> Option<Vec<u8>> {
        self.state.lock().unwrap().blocks.get(hash).cloned()
    }

    fn accept_headers(&self, headers: &[Header]) -> Result<HeadersOutcome, HeadersError> {
        let mut s = self.state.lock().unwrap();
        let mut new = 0;
        let mut last_height = 0;
        for (i, h) in headers.iter().enumerate() {
            if i > 0 && h.prev_blockhash != headers[i - 1].block_hash() {
                return Err(HeadersError::NotContinuous { index: i });
            }
            let hash = h.block_hash();
            if let Some(e) = s.headers.get(&hash) {
                last_height = e.height;
                continue;
            }
            let Some(parent) = s.headers.get(&h.prev_blockhash) else {
                return Err(HeadersError::Unconnected {
                    hash,
                    prev: h.prev_blockhash,
                });
            };
            let entry = Entry {
                height: parent.height + 1,
                header: *h,
                work: parent.work + h.work(),
            };
            last_height = entry.height;
            if entry.work > s.headers[&s.best_header].work {
                s.best_header = hash;
            }
            s.headers.insert(hash, entry);
            new += 1;
        }
        let best = (s.headers[&s.best_header].height, s.best_header);
        Ok(HeadersOutcome::new(new, last_height, best))
    }

    fn blocks_to_fetch(&self, max: usize) -> Vec<BlockHash> {
        let s = self.state.lock().unwrap();
        let tip_height = (s.active.len() - 1) as u32;
        let limit = tip_height + 1024;
        // One walk down the most-work header chain to the validated tip.
        let mut chain = Vec::new();
        let mut h = s.best_header;
        while let Some(e) = s.headers.get(&h) {
            if e.height <= tip_height {
                break;
            }
            if e.height <= limit {
                chain.push(h);
            }
            h = e.header.prev_blockhash;
        }
        chain.reverse();
        chain
            .into_iter()
            .filter(|h| !s.blocks.contains_key(h))
            .take(max)
            .collect()
    }

    fn submit_block(&self, block: Block) -> Result<SubmitOutcome, SubmitError> {
        let hash = block.block_hash();
        let mut s = self.state.lock().unwrap();
        if !s.headers.contains_key(&hash) {
            return Err(SubmitError::UnknownHeader { hash });
        }
        if s.blocks.contains_key(&hash) {
            return Ok(SubmitOutcome::Duplicate);
        }
        s.blocks.insert(hash, serialize(&block));
        s.submitted += 1;
        let before = *s.active.last().unwrap();
        Self::recompute_active(&mut s);
        let after = *s.active.last().unwrap();
        if before != after {
            Ok(SubmitOutcome::NewTip {
                height: (s.active.len() - 1) as u32,
                hash: after,
            })
        } else {
            Ok(SubmitOutcome::Accepted)
        }
    }

    fn filter_index_synced(&self) -> bool {
        self.state.lock().unwrap().filters_synced
    }

    fn cfilters(
        &self,
        start_height: u32,
        stop: BlockHash,
    ) -> Result<Vec<(BlockHash, Vec<u8>)>, FilterQueryError> {
        let s = self.state.lock().unwrap();
        Self::branch(&s, start_height, stop)?
            .into_iter()
            .map(|h| match s.filters.get(&h) {
                Some((f, _)) => Ok((h, f.clone())),
                None => Err(FilterQueryError::NotIndexed { hash: h }),
            })
            .collect()
    }

    fn cfheaders(
        &self,
        start_height: u32,
        stop: BlockHash,
    ) -> Result<(FilterHeader, Vec<FilterHash>), FilterQueryError> {
        let s = self.state.lock().unwrap();
        let branch = Self::branch(&s, start_height, stop)?;
        let prev = if start_height == 0 {
            FilterHeader::all_zeros()
        } else {
            let h = s.headers[&branch[0]].header.prev_blockhash;
            s.filters
                .get(&h)
                .ok_or(FilterQueryError::NotIndexed { hash: h })?
                .1
        };
        let hashes = branch
            .into_iter()
            .map(|h| match s.filters.get(&h) {
                Some((f, _)) => Ok(FilterHash::hash(f)),
                None => Err(FilterQueryError::NotIndexed { hash: h }),
            })
            .collect::<Result<_, _>>()?;
        Ok((prev, hashes))
    }

    fn cfcheckpt(&self, stop: BlockHash) -> Result<Vec<FilterHeader>, FilterQueryError> {
        let s = self.state.lock().unwrap();
        let branch = Self::branch(&s, 0, stop)?;
        branch
            .iter()
            .enumerate()
            .filter(|(height, _)| *height > 0 && height % super::CFCHECKPT_INTERVAL as usize == 0)
            .map(|(_, h)| {
                s.filters
                    .get(h)
                    .map(|f| f.1)
                    .ok_or(FilterQueryError::NotIndexed { hash: *h })
            })
            .collect()
    }
}
