//! The batch book, line ids and references, and results kept within their budget.

use super::*;

#[test]
fn a_line_id_fits_every_providers_custom_id_whatever_the_job_id() {
    let id = line_id("tenant/a.b:c", 3, 17);
    assert!(id.len() <= 64, "{id}");
    assert!(
        id.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    );
    assert!(id.ends_with("-a3-e17"));
    // Another epoch of the same attempt is another line.
    assert_ne!(id, line_id("tenant/a.b:c", 3, 18));
    assert_ne!(id, line_id("tenant/a.b:d", 3, 17));
    // Another deployment, or another input under the same job id, is another line.
    let scoped = scoped_line_id("prod", "tenant/a.b:c", "d1", 3, 17);
    assert_ne!(
        scoped,
        scoped_line_id("staging", "tenant/a.b:c", "d1", 3, 17)
    );
    assert_ne!(scoped, scoped_line_id("prod", "tenant/a.b:c", "d2", 3, 17));
    assert_ne!(scoped, id);
    assert!(scoped.ends_with("-a3-e17"), "{scoped}");
    let longest = line_id(&"x".repeat(128), u32::MAX, u64::MAX);
    assert!(longest.len() <= 64, "{longest}");
}

#[test]
fn references_read_back_as_written_and_others_are_not_batch_references() {
    let line = line_id("j", 1, 1);
    assert_eq!(
        parse_ref(&batch_ref("batch_abc", &line)),
        Some((Some("batch_abc"), line.as_str()))
    );
    assert_eq!(parse_ref(&pending_ref(&line)), Some((None, line.as_str())));
    assert_eq!(parse_ref("resp_123"), None);
    assert_eq!(parse_ref("sim:j/1@1"), None);
    assert_eq!(parse_ref("batch:abc:"), None);
}

#[test]
fn a_running_batch_is_asked_again_once_stale_an_ended_one_never() {
    let book = Book::default();
    book.keep("b1", 100, Status::Running(None));
    assert!(matches!(
        book.status("b1", 100),
        Some(Status::Running(None))
    ));
    assert!(book.status("b1", 101).is_none());
    book.keep("b1", 200, Status::Ended(Arc::default()));
    assert!(matches!(book.status("b1", 10_000), Some(Status::Ended(_))));
    book.place("l1", "b1");
    assert_eq!(book.found("l1").as_deref(), Some("b1"));
}

/// A provider whose one ended batch holds `lines` results of `size` bytes each, counting
/// how often its results are read.
struct BigResults {
    book: Book,
    lines: usize,
    size: usize,
    reads: std::sync::atomic::AtomicUsize,
}

impl BatchApi for BigResults {
    fn book(&self) -> &Book {
        &self.book
    }

    async fn status(&self, _batch_id: &str, want: &str) -> Result<Status, Retrieval> {
        self.reads.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let mut reading = Results::reading(want);
        for i in 0..self.lines {
            let id = format!("line-{i}");
            let raw = format!("{id}:{}", "x".repeat(self.size));
            reading.line(id, &raw);
        }
        Ok(Status::Ended(Arc::new(reading.done())))
    }

    fn list_path(&self, _after: Option<&str>) -> String {
        String::new()
    }

    async fn get_json(&self, _path: &str) -> Result<Value, Retrieval> {
        Err(Retrieval::Unsupported)
    }

    fn created_ms(&self, _batch: &Value) -> Option<Millis> {
        None
    }

    async fn holds(&self, _batch_id: &str, _line: &str) -> Option<bool> {
        None
    }

    fn line_result(&self, raw: &str, _req: &ProviderRequest<'_>) -> Retrieval {
        let id = raw.split(':').next().unwrap_or_default().to_owned();
        Retrieval::Failed(ProviderError::Permanent { reason: id })
    }
}

#[tokio::test]
async fn results_past_the_budget_keep_the_line_asked_for_and_read_again_for_the_others() {
    // GIVEN an ended batch of ten 1 MiB lines: 10 MiB of results, past one read's 4 MiB
    let api = BigResults {
        book: Book::default(),
        lines: 10,
        size: 1_048_576,
        reads: std::sync::atomic::AtomicUsize::new(0),
    };
    let contract = crate::job::contract::Contract::free_text("c");
    let input = serde_json::Map::new();
    let req = ProviderRequest {
        job_id: "j",
        attempt: 1,
        epoch: 1,
        contract: "c",
        output: &contract,
        input: &input,
        input_json: "{}",
        max_output_tokens: 0,
        idempotency_key: String::new(),
        progress: None,
    };
    let found = |said: Retrieval| match said {
        Retrieval::Failed(ProviderError::Permanent { reason }) => reason,
        other => panic!("{other:?}"),
    };
    // WHEN the last line is asked for, then the first, then one in the middle
    let last = found(retrieve_line(&api, &batch_ref("b1", "line-9"), 0, &req).await);
    let first = found(retrieve_line(&api, &batch_ref("b1", "line-0"), 0, &req).await);
    let middle = found(retrieve_line(&api, &batch_ref("b1", "line-5"), 0, &req).await);
    // THEN each got its own line; the first read kept what fit and the line asked for,
    // so the first line came from the book, and the middle one, not kept, was read again
    assert_eq!((last.as_str(), first.as_str()), ("line-9", "line-0"));
    assert_eq!(middle, "line-5");
    assert_eq!(api.reads.load(std::sync::atomic::Ordering::SeqCst), 2);
    let Some(Status::Ended(kept)) = api.book.status("b1", 0) else {
        panic!("kept");
    };
    assert!(
        kept.bytes <= RESULTS_READ_BYTES + 1_048_576 + 16,
        "{}",
        kept.bytes
    );
    assert_eq!(kept.holds("line-7"), None, "not kept: read again to tell");
    assert_eq!(kept.holds("line-0"), Some(true));
}

#[test]
fn the_book_keeps_results_within_its_bytes_the_oldest_going_first() {
    let book = Book::default();
    let big = |want: &str| {
        let mut reading = Results::reading(want);
        reading.line(
            want.to_owned(),
            &"x".repeat(RESULTS_READ_BYTES - want.len()),
        );
        Status::Ended(Arc::new(reading.done()))
    };
    for (i, batch) in ["b1", "b2", "b3", "b4", "b5"].iter().enumerate() {
        book.keep(batch, i as Millis, big("l"));
    }
    // Four reads' worth fit: the oldest went.
    assert!(book.status("b1", 0).is_none());
    assert!(book.status("b5", 0).is_some());
    assert!(book.status("b2", 0).is_some());
}
