//! The SDK's floor and our CPU per DynamoDB request against it: the floor (a bare conditional
//! `UpdateItem`), a fresh job's two requests sent bare, the ledger's writes alone, and fresh and
//! redelivered records through the handler, alternated in one place so each is measured alike.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use aws_sdk_dynamodb::types::{AttributeValue, ReturnValue, ReturnValuesOnConditionCheckFailure};
use fenced_jobs::clock::{Clock, SystemClock};
use fenced_jobs::job::{Expect, JobDefaults, NewJob, ResultBody};
use fenced_jobs::ledger::dynamodb::DynamoLedger;
use fenced_jobs::ledger::{AttemptEnd, ClaimRequest, EndRequest, JobLedger, Write};
use futures::{StreamExt, stream};

use super::cpu::{median, process_cpu_ns};
use super::{
    ALTERNATIONS, SLICE_MS, Shape, event_json, measure_for, memory_handler, parse, per_request,
    redelivery, run, sdk_handler, settings,
};

/// The SDK's own floor: bare conditional `UpdateItem` calls through the handler's DynamoDB
/// client, on the handler's table, as many in flight as the handler runs records.
pub(super) struct Floor {
    pub(super) client: aws_sdk_dynamodb::Client,
    pub(super) table: String,
}

impl Floor {
    /// CPU per request (µs) over `ms` of wall time, in rounds of `n` requests with
    /// `in_flight` of them in flight at a time (as the handler runs a batch's records), each
    /// creating a small item under a condition (as a fresh claim creates the job's item).
    pub(super) async fn cpu_per_request_us(&self, n: usize, in_flight: usize, ms: u64) -> f64 {
        let tag = fastrand::u32(..);
        let started = Instant::now();
        let (mut cpu, mut requests) = (0, 0);
        while requests == 0 || started.elapsed() < Duration::from_millis(ms) {
            let before = process_cpu_ns();
            stream::iter(requests..requests + n)
                .map(|i| {
                    self.client
                        .update_item()
                        .table_name(&self.table)
                        .key("job_id", AttributeValue::S(format!("floor-{tag}-{i}")))
                        .update_expression("SET #v = :v")
                        .condition_expression("attribute_not_exists(#v)")
                        .expression_attribute_names("#v", "v")
                        .expression_attribute_values(":v", AttributeValue::N("1".to_owned()))
                        .send()
                })
                .buffer_unordered(in_flight)
                .for_each(|result| async move {
                    result.expect("floor update");
                })
                .await;
            cpu += process_cpu_ns() - before;
            requests += n;
        }
        cpu as f64 / 1e3 / requests as f64
    }

    /// A claim's `PutItem`, as the ledger sends it for a fresh job (the same attributes).
    async fn claim_bare(&self, id: &str) {
        // The times as a fresh claim writes them: a day's deadline, a 5-minute lease, and the
        // item kept 30 days past its deadline.
        let at = SystemClock.now_ms();
        let deadline = at + 86_400_000;
        let (now, deadline_at) = (at.to_string(), deadline.to_string());
        let owner_until = (at + 300_000).to_string();
        let expires_at = (deadline / 1_000 + 30 * 86_400).to_string();
        let owner = format!("bench-10451536109615056148/{id}-msg");
        let sv = |v: &str| AttributeValue::S(v.to_owned());
        let nv = |v: &str| AttributeValue::N(v.to_owned());
        let entry = HashMap::from([
            ("number".to_owned(), nv("1")),
            ("epoch".to_owned(), nv("1")),
            ("owner_id".to_owned(), sv(&owner)),
            ("started_at".to_owned(), nv(&now)),
            ("outcome".to_owned(), sv("pending")),
            ("provider_ref".to_owned(), sv(&format!("sim:{id}/1@1"))),
            ("provider".to_owned(), sv("simulated")),
            ("model".to_owned(), sv("sim-1")),
        ]);
        let item = HashMap::from([
            ("job_id".to_owned(), sv(id)),
            ("state".to_owned(), sv("running")),
            ("owner_epoch".to_owned(), nv("1")),
            ("attempts".to_owned(), nv("1")),
            ("max_attempts".to_owned(), nv("3")),
            ("input_digest".to_owned(), sv(&"8d47eb98".repeat(8))),
            ("contract".to_owned(), sv("summary.v1")),
            ("deadline_at".to_owned(), nv(&deadline_at)),
            (
                "attempt_log".to_owned(),
                AttributeValue::L(vec![AttributeValue::M(entry)]),
            ),
            ("created_at".to_owned(), nv(&now)),
            ("updated_at".to_owned(), nv(&now)),
            ("expires_at".to_owned(), nv(&expires_at)),
            ("owner_id".to_owned(), sv(&owner)),
            ("owner_until".to_owned(), nv(&owner_until)),
            // Any day: only its size counts here.
            ("due_day".to_owned(), sv("2026-12-06")),
        ]);
        self.client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(item))
            .condition_expression("attribute_not_exists(job_id)")
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .send()
            .await
            .expect("bare claim");
    }

    /// An acceptance's `UpdateItem`, as the ledger sends it for a first claim's short answer.
    async fn accept_bare(&self, id: &str) {
        let now = AttributeValue::N(SystemClock.now_ms().to_string());
        let sv = |v: &str| AttributeValue::S(v.to_owned());
        let nv = |v: &str| AttributeValue::N(v.to_owned());
        let usage = HashMap::from(
            [
                ("cache_write", "0"),
                ("cache_read", "0"),
                ("output", "8"),
                ("reasoning", "0"),
                ("cost_micros", "71"),
                ("input", "39"),
            ]
            .map(|(k, v)| (k.to_owned(), nv(v))),
        );
        let names = [
            ("#cancel", "cancel_requested"),
            ("#finish", "finish"),
            ("#usage", "usage"),
            ("#state", "state"),
            ("#log", "attempt_log"),
            ("#result", "result"),
            ("#attn", "attention"),
            ("#deadline", "deadline_at"),
            ("#updated", "updated_at"),
            ("#outcome", "outcome"),
            ("#epoch", "owner_epoch"),
            ("#attempts", "attempts"),
            ("#finished", "finished_at"),
        ]
        .map(|(k, v)| (k.to_owned(), v.to_owned()));
        let values = HashMap::from([
            (":now".to_owned(), now),
            (":finish".to_owned(), sv("stop")),
            (":usage".to_owned(), AttributeValue::M(usage)),
            (":outcome".to_owned(), sv("succeeded")),
            (":running".to_owned(), sv("running")),
            (":to".to_owned(), sv("succeeded")),
            (
                ":result".to_owned(),
                sv(
                    r#"{"contract":"summary.v1","model":"sim-1","output":"simulated answer f0a193e2450d","usage":{"input_tokens":39,"output_tokens":8}}"#,
                ),
            ),
            (":epoch".to_owned(), nv("1")),
            (":attempt".to_owned(), nv("1")),
        ]);
        self.client
            .update_item()
            .table_name(&self.table)
            .key("job_id", sv(id))
            .update_expression("SET #state = :to, #updated = :now, #log[0].#outcome = :outcome, #log[0].#finished = :now, #result = :result, #log[0].#finish = :finish, #log[0].#usage = :usage REMOVE #attn")
            .condition_expression("#state = :running AND #epoch = :epoch AND #attempts = :attempt AND #deadline > :now AND attribute_not_exists(#cancel)")
            .set_expression_attribute_names(Some(HashMap::from(names)))
            .set_expression_attribute_values(Some(values))
            .return_values(ReturnValue::None)
            .return_values_on_condition_check_failure(
                ReturnValuesOnConditionCheckFailure::AllOld,
            )
            .send()
            .await
            .expect("bare acceptance");
    }
}

/// A fresh job's two requests as the ledger sends them (the claim's `PutItem` of the whole item,
/// the acceptance's `UpdateItem` with its expressions), built bare from literals: the SDK's own
/// cost of the bytes the design sends, without the ledger's code. CPU per request (µs).
pub(super) async fn same_requests_cpu_per_request_us(
    floor: &Floor,
    n: usize,
    in_flight: usize,
    ms: u64,
) -> f64 {
    cpu_per_request_of_jobs(n, in_flight, ms, |tag, i, _| async move {
        let id = format!("bare-{tag}-{i}");
        floor.claim_bare(&id).await;
        floor.accept_bare(&id).await;
    })
    .await
}

/// CPU per request (µs) of rounds of `n` fresh jobs with `in_flight` at a time, over `ms` of
/// wall time: each job `job(tag, i, now)` makes two requests (a claim and an acceptance).
async fn cpu_per_request_of_jobs<F, Fut>(n: usize, in_flight: usize, ms: u64, job: F) -> f64
where
    F: Fn(u32, usize, i64) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let tag = fastrand::u32(..);
    let started = Instant::now();
    let (mut cpu, mut requests, mut jobs) = (0, 0, 0);
    while requests == 0 || started.elapsed() < Duration::from_millis(ms) {
        let before = process_cpu_ns();
        let now = SystemClock.now_ms();
        stream::iter(jobs..jobs + n)
            .map(|i| job(tag, i, now))
            .buffer_unordered(in_flight)
            .for_each(|()| async {})
            .await;
        cpu += process_cpu_ns() - before;
        requests += 2 * n;
        jobs += n;
    }
    cpu as f64 / 1e3 / requests as f64
}

/// The ledger's own writes without the handler, in rounds of `n` jobs with `in_flight` at a
/// time: each claimed fresh and finished with a short answer, as a fresh record is. CPU per
/// request (µs).
pub(super) async fn ledger_cpu_per_request_us(
    ledger: &DynamoLedger,
    n: usize,
    in_flight: usize,
    ms: u64,
) -> f64 {
    cpu_per_request_of_jobs(n, in_flight, ms, |tag, i, now| async move {
        let msg = fenced_jobs::job::parse_body(Some(
            &format!(r#"{{"job_id":"ledger-{tag}-{i}","contract":"summary.v1","input":{{"model":"sim-1","messages":[{{"role":"user","content":"Summarise document {i}."}}]}}}}"#),
        ))
        .expect("message");
        let job = NewJob::from_message(&msg, now, &JobDefaults::default());
        let claim = ClaimRequest {
            job,
            expect: Expect::FRESH,
            owner_id: format!("owner-{i}"),
            now,
            lease_until: now + 300_000,
            provider_ref: None,
            route: None,
            first_sight: true,
            list_due: false,
        };
        let Ok(Write::Applied(record)) = ledger.claim(claim).await else {
            panic!("claim refused");
        };
        let finish = EndRequest {
            job_id: record.job_id.clone(),
            epoch: record.owner_epoch,
            attempt: record.attempts,
            now,
            end: AttemptEnd::Succeeded {
                result: ResultBody::Inline("simulated answer".to_owned()),
                finish: fenced_jobs::job::contract::Finish::Stop,
            },
            usage: None,
            input: None,
        };
        let accepted = ledger.end_known(&record, finish).await;
        assert!(matches!(accepted, Ok(Write::Applied(_))));
    })
    .await
}

/// The comparison with the floor, for 10 and 100 records per batch.
pub(super) async fn floor_table() {
    println!(
        "\nOur CPU per DynamoDB request against the SDK's floor (a bare conditional `UpdateItem` through the same client, in rounds of a batch's size with as many in flight as the handler), medians of {ALTERNATIONS} alternations, µs per request (multiple of the floor):\n"
    );
    println!(
        "| records per batch | in flight | floor | a fresh job's two requests, bare | ledger writes alone | fresh records | redelivered records |"
    );
    println!("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    for n in [10, 100] {
        floor_row(n).await;
    }
}

/// Our CPU per DynamoDB request against the floor, for `n`-record batches: the floor (with as
/// many requests in flight as the handler runs records), the ledger's writes alone, fresh and
/// redelivered records, alternating `ALTERNATIONS` times so that the machine's drift touches
/// each alike. Medians, and each as a multiple of the floor's.
async fn floor_row(n: usize) {
    let (handler, floor, calls) = sdk_handler(false).await;
    let in_flight = n.min(settings().max_concurrency);
    let tag = format!("floor{n}-{}", fastrand::u32(..));
    let fresh_json = |round: usize| event_json(&format!("{tag}-r{round}"), n, 1, Shape::default());
    let first = fresh_json(0);
    run(&handler, &parse(&first)).await;
    let first = redelivery(&first);
    let (mut floors, mut bare, mut ledgers) = (vec![], vec![], vec![]);
    let (mut fresh, mut again) = (vec![], vec![]);
    let mut round = 1;
    for _ in 0..ALTERNATIONS {
        floors.push(floor.cpu_per_request_us(n, in_flight, SLICE_MS).await);
        bare.push(same_requests_cpu_per_request_us(&floor, n, in_flight, SLICE_MS).await);
        let ledger = handler.processor().ledger();
        ledgers.push(ledger_cpu_per_request_us(ledger, n, in_flight, SLICE_MS).await);
        calls.reset();
        let m = measure_for(&handler, n, SLICE_MS, round, fresh_json).await;
        round += m.records / n;
        fresh.push(per_request(&m, &calls));
        calls.reset();
        let m = measure_for(&handler, n, SLICE_MS, 0, |_| first.clone()).await;
        again.push(per_request(&m, &calls));
    }
    let floor = median(floors);
    let [bare, ledger, fresh, again] = [bare, ledgers, fresh, again].map(median);
    println!(
        "| {n} | {in_flight} | {floor:.1} | {bare:.1} ({:.2}) | {ledger:.1} ({:.2}) | {fresh:.1} ({:.2}) | {again:.1} ({:.2}) |",
        bare / floor,
        ledger / floor,
        fresh / floor,
        again / floor,
    );
}

/// One kind of the floor comparison alone (`floor`, `bare`, `ledger`, `fresh` or `redelivered`) for
/// `ms`, `n` records per batch: prints its CPU per DynamoDB request. `memory-fresh` and
/// `memory-redelivered` run the in-memory handler instead (CPU per record): the handler's own
/// work, for a profiler.
pub(super) async fn only(kind: &str, n: usize, ms: u64) {
    let (handler, floor, calls) = sdk_handler(false).await;
    let memory = memory_handler();
    let in_flight = n.min(settings().max_concurrency);
    let tag = format!("only{n}-{}", fastrand::u32(..));
    let fresh = |round: usize| event_json(&format!("{tag}-r{round}"), n, 1, Shape::default());
    // Redelivered batches: the first one handled fresh, then delivered again and again.
    let first = event_json(&tag, n, 1, Shape::default());
    let again = redelivery(&first);
    match kind {
        "redelivered" => run(&handler, &parse(&first)).await,
        "memory-redelivered" => run(&memory, &parse(&first)).await,
        _ => {}
    }
    calls.reset();
    let (figure, unit) = match kind {
        "floor" => (
            floor.cpu_per_request_us(n, in_flight, ms).await,
            "DynamoDB request",
        ),
        "bare" => (
            same_requests_cpu_per_request_us(&floor, n, in_flight, ms).await,
            "DynamoDB request",
        ),
        "ledger" => {
            let ledger = handler.processor().ledger();
            let us = ledger_cpu_per_request_us(ledger, n, in_flight, ms).await;
            (us, "DynamoDB request")
        }
        "fresh" => {
            let m = measure_for(&handler, n, ms, 0, fresh).await;
            (per_request(&m, &calls), "DynamoDB request")
        }
        "redelivered" => {
            let m = measure_for(&handler, n, ms, 0, |_| again.clone()).await;
            (per_request(&m, &calls), "DynamoDB request")
        }
        "memory-fresh" => {
            let m = measure_for(&memory, n, ms, 0, fresh).await;
            (m.cpu_per_record_us, "record")
        }
        "memory-redelivered" => {
            let m = measure_for(&memory, n, ms, 0, |_| again.clone()).await;
            (m.cpu_per_record_us, "record")
        }
        _ => panic!(
            "only floor|bare|ledger|fresh|redelivered|memory-fresh|memory-redelivered [records] [ms]"
        ),
    };
    let requests = calls.total("dynamodb");
    println!("{kind}: {figure:.1} µs per {unit}, {requests} DynamoDB requests");
}
