//! sled trees with typed keys and values ([`TypedTree`]), and every tree of
//! the index database declared once ([`Trees`]).

use std::marker::PhantomData;
use std::path::Path;
use std::sync::Arc;

use super::{BlockRecord, Codec, StoreError};
use crate::primitives::BlockId;

/// A sled tree with typed keys and values.
#[derive(Clone, Debug)]
pub struct TypedTree<K, V> {
    name: &'static str,
    pub(super) tree: sled::Tree,
    /// The database directory, named by every error.
    path: Arc<Path>,
    _types: PhantomData<(K, V)>,
}

impl<K: Codec, V: Codec> TypedTree<K, V> {
    pub(super) fn open(
        db: &sled::Db,
        path: &Arc<Path>,
        name: &'static str,
    ) -> Result<Self, StoreError> {
        let tree = db.open_tree(name).map_err(|source| StoreError::Open {
            path: path.to_path_buf(),
            source: source.into(),
        })?;
        Ok(TypedTree {
            name,
            tree,
            path: path.clone(),
            _types: PhantomData,
        })
    }

    /// [`StoreError::Read`] of this tree's database.
    pub(super) fn read_err(&self, source: sled::Error) -> StoreError {
        StoreError::Read {
            path: self.path.to_path_buf(),
            source,
        }
    }

    /// [`StoreError::Corrupt`] for an entry of this tree.
    pub(super) fn corrupt(&self, reason: &'static str) -> StoreError {
        StoreError::Corrupt {
            path: self.path.to_path_buf(),
            tree: self.name,
            reason,
        }
    }

    /// One stored (key, value), decoded.
    fn decode_entry(&self, k: &[u8], v: &[u8]) -> Result<(K, V), StoreError> {
        K::decode(k)
            .zip(V::decode(v))
            .ok_or_else(|| self.corrupt("entry does not decode"))
    }

    /// The value of `key`.
    ///
    /// # Errors
    /// [`StoreError::Read`] (sled failure, damaged files), or
    /// [`StoreError::Corrupt`] if the value does not decode.
    pub fn get(&self, key: &K) -> Result<Option<V>, StoreError> {
        match self.tree.get(key.encode()).map_err(|e| self.read_err(e))? {
            None => Ok(None),
            Some(v) => V::decode(&v)
                .map(Some)
                .ok_or_else(|| self.corrupt("value does not decode")),
        }
    }

    /// Every (key, value) whose key starts with `prefix`, in key order.
    ///
    /// # Errors
    /// [`StoreError::Read`] or [`StoreError::Corrupt`] entries.
    pub fn scan_prefix(&self, prefix: &[u8]) -> Result<Vec<(K, V)>, StoreError> {
        let mut out = Vec::new();
        for item in self.tree.scan_prefix(prefix) {
            let (k, v) = item.map_err(|e| self.read_err(e))?;
            out.push(self.decode_entry(&k, &v)?);
        }
        Ok(out)
    }

    /// Calls `f` with every (key, value), in key order, one at a time.
    ///
    /// # Errors
    /// [`StoreError::Read`], [`StoreError::Corrupt`] entries, `f`'s errors.
    pub fn for_each<E: From<StoreError>>(
        &self,
        f: &mut dyn FnMut(K, V) -> Result<(), E>,
    ) -> Result<(), E> {
        for item in self.tree.iter() {
            let (k, v) = item.map_err(|e| self.read_err(e))?;
            let (k, v) = self.decode_entry(&k, &v)?;
            f(k, v)?;
        }
        Ok(())
    }

    /// Every value, in key order.
    ///
    /// # Errors
    /// [`StoreError::Read`] or [`StoreError::Corrupt`] entries.
    pub fn values(&self) -> Result<Vec<V>, StoreError> {
        self.scan_prefix(&[])
            .map(|v| v.into_iter().map(|(_, v)| v).collect())
    }
}

/// Every tree of the index database, declared once.
#[derive(Clone, Debug)]
pub struct Trees {
    /// Metadata by name.
    pub meta_by_name: TypedTree<String, Vec<u8>>,
    /// Block records by id.
    pub block_by_id: TypedTree<BlockId, BlockRecord>,
    /// Active-chain block ids by height.
    pub block_id_by_height: TypedTree<u32, BlockId>,
}
