//! The index rows of a group's blocks (transactions, spends, address
//! history) applied to the row store's memory (`store::runs`) on a thread
//! of their own, while the writer goes on with the next blocks.
//!
//! Inserting those rows (into sled, then) was two thirds of the writer
//! thread's CPU in a regtest-a import (`docs/benchmarks-history.md`, "Import profile"),
//! all of it at the group's durable boundary, with the other core idle. Readers
//! ignore rows of blocks that are not connected (index format 3.0), so
//! rows may reach the database before their block's commit: each block of
//! a group hands its rows here as soon as it is connected in memory, and
//! every index commit first waits for the rows sent before it
//! ([`RowWriter::wait`]), so the commit's flush makes them durable before
//! its transaction names their blocks, as when the commit applied them
//! itself.

use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::thread::JoinHandle;

use crate::store::{RowBatch, Store, StoreError};

/// Blocks' rows queued before [`RowWriter::send`] waits for the thread:
/// bounds the memory of rows not yet applied.
const QUEUE_BLOCKS: usize = 64;

/// What the writer sends to the rows thread.
enum Message {
    /// One block's rows.
    Rows(RowBatch),
    /// Answer with the first error since the last answer, once every
    /// batch sent before is applied.
    Wait(SyncSender<Result<(), StoreError>>),
}

/// The rows thread: started with the first rows, stopped on drop.
pub(super) struct RowWriter {
    store: Store,
    running: Option<(SyncSender<Message>, JoinHandle<()>)>,
}

impl RowWriter {
    /// A writer of `store`'s rows (no thread until the first rows).
    pub(super) fn new(store: Store) -> Self {
        RowWriter {
            store,
            running: None,
        }
    }

    /// Queues `rows` (one block's) to be applied on the rows thread.
    ///
    /// # Errors
    /// The thread could not be started, or has stopped (it panicked).
    pub(super) fn send(&mut self, rows: RowBatch) -> Result<(), StoreError> {
        if rows.is_empty() {
            return Ok(());
        }
        let sender = match &self.running {
            Some((sender, _)) => sender.clone(),
            None => self.start()?,
        };
        sender
            .send(Message::Rows(rows))
            .map_err(|_| thread_gone(&self.store))
    }

    /// Waits until every row sent before is applied.
    ///
    /// # Errors
    /// The first failure to apply rows since the last wait (those rows may
    /// be missing: the caller must not commit), or the thread stopped.
    pub(super) fn wait(&mut self) -> Result<(), StoreError> {
        let Some((sender, _)) = &self.running else {
            return Ok(());
        };
        let (reply, answer) = sync_channel(1);
        sender
            .send(Message::Wait(reply))
            .map_err(|_| thread_gone(&self.store))?;
        answer.recv().map_err(|_| thread_gone(&self.store))?
    }

    fn start(&mut self) -> Result<SyncSender<Message>, StoreError> {
        let (sender, receiver) = sync_channel(QUEUE_BLOCKS);
        let store = self.store.clone();
        let span = tracing::Span::current();
        let handle = std::thread::Builder::new()
            .name("kakehi-rows".into())
            .spawn(move || span.in_scope(|| apply_loop(&store, &receiver)))
            .map_err(|source| StoreError::Thread {
                path: self.store.path().to_path_buf(),
                source,
            })?;
        self.running = Some((sender.clone(), handle));
        Ok(sender)
    }
}

impl Drop for RowWriter {
    fn drop(&mut self) {
        if let Some((sender, handle)) = self.running.take() {
            drop(sender);
            // The thread ends when the channel closes; a panic there has
            // nothing left to report to.
            let _ = handle.join();
        }
    }
}

/// The rows thread: applies batches in order, keeps the first error until
/// the next [`Message::Wait`] (skipping the batches after it: the commit
/// they belong to will not happen).
fn apply_loop(store: &Store, receiver: &Receiver<Message>) {
    let mut failed: Option<StoreError> = None;
    while let Ok(message) = receiver.recv() {
        match message {
            Message::Rows(rows) => {
                if failed.is_none() {
                    if let Err(e) = store.apply_rows(rows) {
                        failed = Some(e);
                    }
                }
            }
            Message::Wait(reply) => {
                let _ = reply.send(failed.take().map_or(Ok(()), Err));
            }
        }
    }
}

fn thread_gone(store: &Store) -> StoreError {
    StoreError::Thread {
        path: store.path().to_path_buf(),
        source: std::io::Error::other("the index rows thread stopped"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::primitives::BlockId;
    use crate::store::WriteBatch;
    use bitcoin::hashes::Hash;
    use bitcoin::Txid;

    /// Rows sent are in the database once `wait` returns, and are still
    /// there after a commit whose own batch had no row and a reopen.
    #[test]
    fn rows_are_applied_before_wait_returns() {
        let dir = tempfile::tempdir().unwrap();
        let txids: Vec<Txid> = (1..=300u16)
            .map(|i| {
                let mut b = [0u8; 32];
                b[..2].copy_from_slice(&i.to_be_bytes());
                Txid::from_byte_array(b)
            })
            .collect();
        {
            let store = Store::open(dir.path(), &crate::store::Budgets::default()).unwrap();
            let mut writer = RowWriter::new(store.clone());
            writer.wait().unwrap();
            for (block, chunk) in txids.chunks(10).enumerate() {
                let mut batch = WriteBatch::default();
                for (pos, txid) in chunk.iter().enumerate() {
                    batch.put_tx(txid, BlockId(block as u32 + 1), pos as u32);
                }
                let rows = batch.take_rows();
                assert_eq!(rows.len(), chunk.len());
                writer.send(rows).unwrap();
            }
            writer.wait().unwrap();
            for txid in &txids {
                assert!(store.tx_maybe_known(txid).unwrap(), "{txid}");
            }
            let mut batch = WriteBatch::default();
            batch.put_meta("test", &[1]);
            store.commit(batch).unwrap();
        }
        let store = Store::open(dir.path(), &crate::store::Budgets::default()).unwrap();
        assert_eq!(
            store.tx_candidates(&txids[299]).unwrap(),
            vec![(BlockId(30), 9)]
        );
    }
}
