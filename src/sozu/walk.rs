//! A walk over every page of a shard that exists: layer by layer from
//! layer 0, in page order within a layer, following each page's
//! written-children mask (a child never written has no page).

use std::sync::Arc;

use super::geo::{Addr, Descent, Geo};
use super::page;
use super::SozuError;

/// Visits the pages of one shard down to layer `deepest`: `visit` loads a
/// page (and does with it what it likes) and returns it, for its children.
///
/// # Errors
/// An error of `visit`.
pub(super) fn walk(
    geo: &Geo,
    deepest: u8,
    visit: &mut dyn FnMut(Addr) -> Result<Arc<Vec<u8>>, SozuError>,
) -> Result<(), SozuError> {
    let mut pages: Vec<u64> = (0..geo.layer0_pages()).collect();
    for layer in 0..=deepest.min(geo.max_layer) {
        if pages.is_empty() {
            break;
        }
        pages.sort_unstable();
        let mut next = Vec::new();
        for p in pages {
            let img = visit((layer, p))?;
            if layer < geo.max_layer {
                next.extend(geo.children_of(Descent::of(&page::head(&img))));
            }
        }
        pages = next;
    }
    Ok(())
}
