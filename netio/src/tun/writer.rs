//! The one way decrypted packets go into the tun device, for the server (all connections
//! share one writer) and the client (one per tunnel).
//!
//! A write into a tun device is where the kernel runs the whole inner receive path (IP, TCP,
//! the socket's wake-up), so under load it is the most expensive system call of the receive
//! direction. [`TunWriter`] moves it off the connection tasks onto a thread of its own, fed by
//! a bounded queue: the thread takes what is queued (up to [`TUN_WRITE_BATCH`]) and writes it
//! with consecutive TCP segments of one flow merged ([`Coalescer`]).
//!
//! A lone packet (one decrypted from a socket read that carried just it) when nothing is
//! queued or being written goes straight into the device from the caller: a hand-off to the
//! thread would add its wake-up to every request/response round trip.
//!
//! # Order
//!
//! Packets of one flow come from one caller (a connection task), and they must reach the
//! device in the order that caller handed them over. The shortcut is therefore taken only
//! when no packet is *in flight*: counted from the moment it is queued until the thread's
//! write that carries it has returned. An empty queue is not enough: the thread empties the
//! queue before its write finishes, and a lone packet written directly in that window would
//! overtake the earlier packets of its flow.

use std::io;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::BytesMut;
use tokio::sync::mpsc;

use super::{Coalescer, Tun};

/// Most packets the writer thread takes from its queue and writes at once.
pub const TUN_WRITE_BATCH: usize = 64;

/// Where a [`TunWriter`] writes: the tun device, or a recorder in tests.
pub trait PacketSink: Send + Sync + 'static {
    /// Writes one whole IP packet from the calling thread.
    fn write_one(&self, packet: &[u8]) -> io::Result<()>;
    /// Writes `packets` in order (segments of one TCP flow may be merged, as `gro` plans);
    /// returns how many went in.
    fn write_batch(&self, packets: &mut [BytesMut], gro: &mut Coalescer) -> io::Result<usize>;
}

impl PacketSink for Tun {
    fn write_one(&self, packet: &[u8]) -> io::Result<()> {
        self.send_sync(packet)
    }

    fn write_batch(&self, packets: &mut [BytesMut], gro: &mut Coalescer) -> io::Result<usize> {
        self.send_many_sync(packets, gro)
    }
}

/// Counts of a [`TunWriter`] (shared by its clones and its thread).
#[derive(Debug, Default)]
pub struct TunWriteStats {
    /// Packets the device took.
    pub written: AtomicU64,
    /// Packets dropped because a write failed (each failure logged at debug level).
    pub failed: AtomicU64,
}

/// Hands decrypted packets to the tun device; clones share the thread, the queue and the
/// counts. The thread ends once every clone is dropped and the queue is written.
#[derive(Debug)]
pub struct TunWriter<S: PacketSink = Tun> {
    sink: Arc<S>,
    tx: mpsc::Sender<BytesMut>,
    in_flight: Arc<AtomicUsize>,
    stats: Arc<TunWriteStats>,
}

impl<S: PacketSink> Clone for TunWriter<S> {
    fn clone(&self) -> Self {
        TunWriter {
            sink: Arc::clone(&self.sink),
            tx: self.tx.clone(),
            in_flight: Arc::clone(&self.in_flight),
            stats: Arc::clone(&self.stats),
        }
    }
}

impl<S: PacketSink> TunWriter<S> {
    /// Starts the writer thread (`tun-writer`) with a queue of `queue` packets.
    pub fn spawn(sink: Arc<S>, queue: usize) -> io::Result<TunWriter<S>> {
        let (tx, rx) = mpsc::channel(queue.max(1));
        let writer = TunWriter {
            sink,
            tx,
            in_flight: Arc::new(AtomicUsize::new(0)),
            stats: Arc::new(TunWriteStats::default()),
        };
        let (sink, in_flight, stats) = (
            Arc::clone(&writer.sink),
            Arc::clone(&writer.in_flight),
            Arc::clone(&writer.stats),
        );
        std::thread::Builder::new()
            .name("tun-writer".into())
            .spawn(move || write_queued(&*sink, rx, &in_flight, &stats))?;
        Ok(writer)
    }

    /// Writes `packets` (whole IP packets, in order) and empties the vector: one packet with
    /// nothing in flight is written here and now, anything else is queued for the thread,
    /// waiting while the queue is full (so a connection reads its socket no faster than the
    /// device takes packets). See the module docs for why the order holds.
    pub async fn write(&self, packets: &mut Vec<BytesMut>) {
        if packets.len() == 1 && self.in_flight.load(Ordering::Acquire) == 0 {
            if let Some(packet) = packets.pop() {
                match self.sink.write_one(&packet) {
                    Ok(()) => self.stats.written.fetch_add(1, Ordering::Relaxed),
                    Err(e) => {
                        tracing::debug!(error = %e, "tun write failed; packet dropped");
                        self.stats.failed.fetch_add(1, Ordering::Relaxed)
                    }
                };
            }
            return;
        }
        for packet in packets.drain(..) {
            self.in_flight.fetch_add(1, Ordering::AcqRel);
            let sent = match self.tx.try_send(packet) {
                Ok(()) => Ok(()),
                Err(mpsc::error::TrySendError::Full(packet)) => {
                    self.tx.send(packet).await.map_err(|_| ())
                }
                Err(mpsc::error::TrySendError::Closed(_)) => Err(()),
            };
            if sent.is_err() {
                self.in_flight.fetch_sub(1, Ordering::AcqRel);
                self.stats.failed.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// The counts (shared; they keep counting).
    pub fn stats(&self) -> Arc<TunWriteStats> {
        Arc::clone(&self.stats)
    }
}

/// The writer thread: takes what is queued, up to [`TUN_WRITE_BATCH`], writes it, and only
/// then marks it no longer in flight.
fn write_queued<S: PacketSink>(
    sink: &S,
    mut rx: mpsc::Receiver<BytesMut>,
    in_flight: &AtomicUsize,
    stats: &TunWriteStats,
) {
    let mut batch: Vec<BytesMut> = Vec::with_capacity(TUN_WRITE_BATCH);
    let mut gro = Coalescer::with_capacity(TUN_WRITE_BATCH);
    while let Some(packet) = rx.blocking_recv() {
        batch.push(packet);
        while batch.len() < TUN_WRITE_BATCH {
            match rx.try_recv() {
                Ok(p) => batch.push(p),
                Err(_) => break,
            }
        }
        let taken = batch.len();
        match sink.write_batch(&mut batch, &mut gro) {
            Ok(n) => {
                stats.written.fetch_add(n as u64, Ordering::Relaxed);
                stats
                    .failed
                    .fetch_add(taken.saturating_sub(n) as u64, Ordering::Relaxed);
            }
            Err(e) => {
                tracing::debug!(error = %e, "tun write failed; packets dropped");
                stats.failed.fetch_add(taken as u64, Ordering::Relaxed);
            }
        }
        // The buffers go back to their pools before the packets stop counting as in flight.
        batch.clear();
        in_flight.fetch_sub(taken, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Condvar, Mutex};
    use std::time::Duration;

    /// Records what reaches the "device", by (flow, sequence number) in the packet's first
    /// two bytes. A batch write can be held open (`hold`) to widen the window in which the
    /// thread has emptied the queue but not yet written.
    #[derive(Debug, Default)]
    struct Recorder {
        seen: Mutex<Vec<(u8, u8)>>,
        hold: Mutex<bool>,
        batch_started: Condvar,
        released: Condvar,
        batches: AtomicUsize,
        lone: AtomicUsize,
        pause: Option<Duration>,
    }

    impl Recorder {
        fn record(&self, packet: &[u8]) {
            self.seen
                .lock()
                .unwrap()
                .push((packet[0], packet.get(1).copied().unwrap_or(0)));
        }

        fn wait_for_batch(&self) {
            let hold = self.hold.lock().unwrap();
            let _unused = self
                .batch_started
                .wait_timeout_while(hold, Duration::from_secs(5), |_| {
                    self.batches.load(Ordering::SeqCst) == 0
                })
                .unwrap();
            assert!(self.batches.load(Ordering::SeqCst) > 0, "no batch write");
        }

        fn release(&self) {
            *self.hold.lock().unwrap() = false;
            self.released.notify_all();
        }
    }

    impl PacketSink for Recorder {
        fn write_one(&self, packet: &[u8]) -> io::Result<()> {
            self.lone.fetch_add(1, Ordering::SeqCst);
            self.record(packet);
            Ok(())
        }

        fn write_batch(&self, packets: &mut [BytesMut], _: &mut Coalescer) -> io::Result<usize> {
            let mut hold = self.hold.lock().unwrap();
            self.batches.fetch_add(1, Ordering::SeqCst);
            self.batch_started.notify_all();
            while *hold {
                hold = self.released.wait(hold).unwrap();
            }
            drop(hold);
            if let Some(p) = self.pause {
                std::thread::sleep(p);
            }
            for p in packets.iter() {
                self.record(p);
            }
            Ok(packets.len())
        }
    }

    fn packet(flow: u8, seq: u8) -> BytesMut {
        BytesMut::from(&[flow, seq][..])
    }

    #[tokio::test]
    async fn a_lone_packet_waits_for_the_batch_being_written() {
        let sink = Arc::new(Recorder {
            hold: Mutex::new(true),
            ..Recorder::default()
        });
        let writer = TunWriter::spawn(Arc::clone(&sink), 16).unwrap();
        writer
            .write(&mut vec![packet(1, 1), packet(1, 2), packet(1, 3)])
            .await;
        // The thread has taken all three off the queue and is inside its write.
        tokio::task::spawn_blocking({
            let sink = Arc::clone(&sink);
            move || sink.wait_for_batch()
        })
        .await
        .unwrap();
        // The queue is empty now; the next packet of the flow must still come after them.
        writer.write(&mut vec![packet(1, 4)]).await;
        sink.release();
        let stats = writer.stats();
        drop(writer);
        for _ in 0..500 {
            if stats.written.load(Ordering::Relaxed) == 4 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(
            *sink.seen.lock().unwrap(),
            [(1, 1), (1, 2), (1, 3), (1, 4)],
            "a lone packet overtook its flow"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn every_flow_keeps_its_order_under_concurrent_lone_and_batched_writes() {
        const FLOWS: u8 = 4;
        const PER_FLOW: u8 = 200;
        let sink = Arc::new(Recorder {
            pause: Some(Duration::from_millis(1)),
            ..Recorder::default()
        });
        let writer = TunWriter::spawn(Arc::clone(&sink), 8).unwrap();
        let mut tasks = Vec::new();
        for flow in 0..FLOWS {
            let writer = writer.clone();
            tasks.push(tokio::spawn(async move {
                let mut seq = 0u8;
                let mut round = 0usize;
                while seq < PER_FLOW {
                    // Bursts of 1, 2, 3 and 5 packets, lone ones most often.
                    let n = [1, 1, 2, 1, 3, 1, 5][round % 7].min(usize::from(PER_FLOW - seq));
                    let mut burst: Vec<BytesMut> =
                        (0..n).map(|i| packet(flow, seq + i as u8)).collect();
                    writer.write(&mut burst).await;
                    seq += n as u8;
                    round += 1;
                    if n > 1 {
                        // Give the thread time to take the burst off the queue, so the next
                        // lone packet meets an empty queue and a write still in progress.
                        std::thread::sleep(Duration::from_micros(300));
                    } else if round % 3 == 0 {
                        tokio::task::yield_now().await;
                    }
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        let stats = writer.stats();
        drop(writer);
        let total = u64::from(FLOWS) * u64::from(PER_FLOW);
        for _ in 0..500 {
            if stats.written.load(Ordering::Relaxed) == total {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let seen = sink.seen.lock().unwrap();
        assert_eq!(seen.len() as u64, total);
        for flow in 0..FLOWS {
            let order: Vec<u8> = seen
                .iter()
                .filter(|(f, _)| *f == flow)
                .map(|(_, s)| *s)
                .collect();
            assert!(
                order.windows(2).all(|w| w[0] < w[1]),
                "flow {flow} out of order: {order:?}"
            );
        }
        assert!(
            sink.batches.load(Ordering::SeqCst) > 0,
            "no packet took the queue"
        );
        assert!(
            sink.lone.load(Ordering::SeqCst) > 0,
            "no packet took the shortcut"
        );
    }
}
