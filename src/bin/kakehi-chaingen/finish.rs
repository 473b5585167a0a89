//! After the blocks: the invalid cases on the tip, the UTXO digest from the
//! ledger, and `manifest.json` (written last, through a temporary file and
//! a rename: a directory without it is incomplete).

use crate::generate::{Config, Finished, GenerateError};
use crate::invalid;
use crate::keys::KeyPool;
use crate::manifest::{utxo_digest, FilterHeaderAt, Invalid, Manifest};
use crate::output::{OutputError, Written};

/// Writes the cases, digests the UTXO set and writes the manifest.
///
/// # Errors
/// [`GenerateError`]: a write failed, or the reserve coins are missing.
pub fn finish(
    cfg: &Config,
    keys: &KeyPool,
    written: Written,
    mut run: Finished,
    write_utxos: bool,
) -> Result<Manifest, GenerateError> {
    let reserve = run.reserve.take().ok_or(GenerateError::NoReserve {
        height: cfg.parameters.blocks,
    })?;
    let (cases, control) =
        invalid::write(&cfg.out, &run.tip, &reserve, keys, &mut run.planner.rng)?;
    let mut coins = run.planner.ledger.into_coins();
    let text = write_utxos.then(|| cfg.out.join("utxos.txt"));
    let digest = utxo_digest(&mut coins, keys, text.as_deref())?;
    drop(coins);
    run.stats.summarize_ages();
    let genesis = bitcoin::constants::genesis_block(bitcoin::Network::Regtest);
    let manifest = Manifest {
        generator: format!("kakehi-chaingen {}", env!("CARGO_PKG_VERSION")),
        network: "regtest",
        profile: cfg.profile.clone(),
        seed: cfg.seed,
        parameters: cfg.parameters.clone(),
        genesis_hash: genesis.block_hash().to_string(),
        tip_hash: run.tip.hash.to_string(),
        tip_height: run.tip.height,
        utxo_count: digest.count,
        utxo_total_sats: digest.total_sats,
        utxos_sha256: digest.sha256,
        filter_headers: written
            .filter_headers
            .iter()
            .map(|(height, h)| FilterHeaderAt {
                height: *height,
                filter_header: h.to_string(),
            })
            .collect(),
        files: written.files,
        block_records: written.records,
        blk_bytes: written.bytes,
        stale_blocks: run.stale,
        reorgs: run.reorgs,
        stats: run.stats,
        invalid: Invalid {
            cases: "invalid/cases.json".into(),
            count: cases.len(),
            control: "invalid/control.blk".into(),
            control_hash: control.block_hash().to_string(),
        },
    };
    write_manifest(cfg, &manifest)?;
    Ok(manifest)
}

fn write_manifest(cfg: &Config, manifest: &Manifest) -> Result<(), OutputError> {
    let json = serde_json::to_vec_pretty(manifest).expect("plain data serializes");
    let tmp = cfg.out.join("manifest.json.tmp");
    let path = cfg.out.join("manifest.json");
    std::fs::write(&tmp, json).map_err(|e| OutputError::io(&tmp, e))?;
    std::fs::rename(&tmp, &path).map_err(|e| OutputError::io(&path, e))
}
