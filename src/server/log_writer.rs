//! The log's writer: lines are appended to a buffer under a lock, and a thread writes the
//! buffer out in batches — one write and one wake-up per batch (the lines of up to a period,
//! fewer if the buffer half-fills) instead of one per line.
//!
//! Why not `tracing-appender`'s non-blocking writer: it sends each line over a channel and
//! wakes its thread for it (a futex wake, two context switches and a write(2) per line), a
//! hand-off that costs more than formatting the line. Lines are never dropped: past `limit`
//! bytes waiting, a logging thread waits for the writer.

use std::{
    io::{self, Write},
    sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError},
    thread::JoinHandle,
    time::Duration,
};

/// How long the writer gathers lines after the first one of a batch.
pub const PERIOD: Duration = Duration::from_millis(20);

/// Bytes of lines waiting before a logging thread waits for the writer (~4,096 decision lines).
pub const LIMIT: usize = 1 << 20;

struct Shared {
    state: Mutex<State>,
    /// The writer waits here for lines (and for the end of its period).
    lines: Condvar,
    /// Logging threads wait here for room.
    room: Condvar,
    limit: usize,
}

#[derive(Default)]
struct State {
    buf: Vec<u8>,
    closed: bool,
}

impl Shared {
    /// The state, also after a thread panicked while holding it (a log line is still worth
    /// writing then).
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Hands lines to the writer thread: what `tracing_subscriber` writes each line into.
/// Without a thread (it could not be started), writes each line to stderr itself.
#[derive(Clone)]
pub struct LogWriter(Option<Arc<Shared>>);

impl LogWriter {
    /// A writer without a thread: each line straight to stderr.
    pub fn direct() -> LogWriter {
        LogWriter(None)
    }
}

/// Stops the writer thread once every line is written: dropping it flushes.
pub struct WriterGuard {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

/// A writer of lines to `out`, written every `period` at most, holding at most `limit` bytes.
pub fn spawn<W: Write + Send + 'static>(
    out: W,
    period: Duration,
    limit: usize,
) -> io::Result<(LogWriter, WriterGuard)> {
    let shared = Arc::new(Shared {
        state: Mutex::new(State::default()),
        lines: Condvar::new(),
        room: Condvar::new(),
        limit,
    });
    let theirs = shared.clone();
    let thread = std::thread::Builder::new()
        .name("log-writer".into())
        .spawn(move || write_batches(&theirs, out, period))?;
    Ok((
        LogWriter(Some(shared.clone())),
        WriterGuard {
            shared,
            thread: Some(thread),
        },
    ))
}

fn write_batches<W: Write>(shared: &Shared, mut out: W, period: Duration) {
    let mut batch = Vec::new();
    loop {
        let mut state = shared.lock();
        while state.buf.is_empty() && !state.closed {
            state = shared
                .lines
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
        }
        // The first line of a batch is here: gather more for a period, unless the buffer
        // fills or the log is closing.
        if !state.closed && state.buf.len() < shared.limit / 2 {
            state = shared
                .lines
                .wait_timeout_while(state, period, |s| {
                    !s.closed && s.buf.len() < shared.limit / 2
                })
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        std::mem::swap(&mut batch, &mut state.buf);
        let closed = state.closed;
        drop(state);
        shared.room.notify_all();
        // Nowhere to report a failed write of the log: the lines are dropped, not retried.
        let _ = out.write_all(&batch).and_then(|()| out.flush());
        batch.clear();
        if closed && shared.lock().buf.is_empty() {
            return;
        }
    }
}

impl Write for LogWriter {
    fn write(&mut self, line: &[u8]) -> io::Result<usize> {
        let Some(shared) = self.0.as_deref() else {
            io::stderr().write_all(line)?;
            return Ok(line.len());
        };
        let mut state = shared.lock();
        while state.buf.len() >= shared.limit && !state.closed {
            state = shared
                .room
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
        }
        let first = state.buf.is_empty();
        state.buf.extend_from_slice(line);
        let full = state.buf.len() >= shared.limit / 2;
        drop(state);
        // Only the first line of a batch wakes the writer (or one that half-fills the buffer):
        // the others are written with it at the end of its period.
        if first || full {
            shared.lines.notify_one();
        }
        Ok(line.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for LogWriter {
    type Writer = LogWriter;

    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}

impl Drop for WriterGuard {
    fn drop(&mut self) {
        self.shared.lock().closed = true;
        self.shared.lines.notify_one();
        self.shared.room.notify_all();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;

    /// A sink that records each write call, and can be held shut.
    #[derive(Clone, Default)]
    struct Sink {
        writes: Arc<Mutex<Vec<Vec<u8>>>>,
        shut: Arc<Mutex<()>>,
    }

    impl Write for Sink {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            let _open = self.shut.lock().unwrap();
            self.writes.lock().unwrap().push(buf.to_vec());
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    fn text(sink: &Sink) -> String {
        String::from_utf8(sink.writes.lock().unwrap().concat()).unwrap()
    }

    #[test]
    fn lines_from_many_threads_arrive_whole_in_batches_and_all_by_the_guards_drop() {
        let sink = Sink::default();
        // A long period: every line logged within it goes out in the same write.
        let (writer, guard) = spawn(sink.clone(), Duration::from_millis(300), LIMIT).unwrap();
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let mut w = writer.clone();
                std::thread::spawn(move || {
                    for i in 0..250 {
                        w.write_all(format!("thread {t} line {i}\n").as_bytes())
                            .unwrap();
                    }
                })
            })
            .collect();
        threads.into_iter().for_each(|t| t.join().unwrap());
        drop(guard);
        let text = text(&sink);
        assert_eq!(text.lines().count(), 1000);
        for t in 0..4 {
            let mine: Vec<&str> = text
                .lines()
                .filter(|l| l.starts_with(&format!("thread {t} ")))
                .collect();
            let expected: Vec<String> = (0..250).map(|i| format!("thread {t} line {i}")).collect();
            assert_eq!(mine, expected, "thread {t}'s lines, in its order");
        }
        let writes = sink.writes.lock().unwrap().len();
        assert!(writes <= 3, "1,000 lines in {writes} writes: not batched");
    }

    #[test]
    fn a_line_is_written_within_a_period_without_more_lines_or_a_flush() {
        let sink = Sink::default();
        let (mut writer, _guard) = spawn(sink.clone(), Duration::from_millis(10), LIMIT).unwrap();
        writer.write_all(b"alone\n").unwrap();
        let start = Instant::now();
        while text(&sink).is_empty() {
            assert!(start.elapsed() < Duration::from_secs(10), "never written");
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(text(&sink), "alone\n");
    }

    #[test]
    fn a_stuck_output_makes_logging_wait_past_the_limit_and_loses_nothing() {
        let sink = Sink::default();
        let shut = sink.shut.lock().unwrap();
        let (writer, guard) = spawn(sink.clone(), Duration::from_millis(1), 64).unwrap();
        let mut w = writer.clone();
        let logger = std::thread::spawn(move || {
            for i in 0..100 {
                w.write_all(format!("line {i:03} of padding\n").as_bytes())
                    .unwrap();
            }
        });
        // The writer holds one batch and cannot write it; the logger fills the limit and waits.
        std::thread::sleep(Duration::from_millis(200));
        assert!(!logger.is_finished(), "logging went past the limit");
        drop(shut);
        logger.join().unwrap();
        drop(guard);
        let text = text(&sink);
        let expected: String = (0..100)
            .map(|i| format!("line {i:03} of padding\n"))
            .collect();
        assert_eq!(text, expected);
    }
}
