//! The ledger in DynamoDB: one item per job, every transition one `UpdateItem` with a
//! `ConditionExpression`, `ReturnValues=ALL_NEW` when applied and
//! `ReturnValuesOnConditionCheckFailure=ALL_OLD` when refused.

use std::collections::HashMap;

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::types::{AttributeValue, ReturnValue, ReturnValuesOnConditionCheckFailure};

use super::{
    AttemptEnd, ClaimRequest, CreateRequest, DecideRequest, EnqueuedRequest, FinishRequest,
    JobLedger, LedgerError, RecordRefRequest, RecoverRequest, RenewRequest, SettleFrom,
    SettleRequest, Write,
};
use crate::job::{
    ATTENTION_SHARDS, AttemptOutcome, AttemptRecord, DecisionRecord, ErrorRecord, JobRecord,
    JobState, Millis, NewJob, RecoveryRecord, attention_key, attention_shard,
};

type Item = HashMap<String, AttributeValue>;

/// The sparse index of jobs that are not terminal: key `attention` (`state#shard`), sort key
/// `updated_at`, keys only. Terminal items carry no `attention` and are not in it.
pub const ATTENTION_INDEX: &str = "attention-index";

/// The sparse index of the same jobs by deadline: key `attention`, sort key `deadline_at`, keys
/// only. The reconciler finds jobs past their deadline with it.
pub const DEADLINE_INDEX: &str = "deadline-index";

/// Attribute names, each used through a `#placeholder` (several are DynamoDB reserved words).
const NAMES: [(&str, &str); 25] = [
    ("#id", "job_id"),
    ("#state", "state"),
    ("#epoch", "owner_epoch"),
    ("#attempts", "attempts"),
    ("#max", "max_attempts"),
    ("#digest", "input_digest"),
    ("#contract", "contract"),
    ("#input", "input"),
    ("#meta", "metadata"),
    ("#deadline", "deadline_at"),
    ("#owner", "owner_id"),
    ("#until", "owner_until"),
    ("#log", "attempt_log"),
    ("#rec", "recoveries"),
    ("#dec", "decisions"),
    ("#attn", "attention"),
    ("#result", "result"),
    ("#err", "last_error"),
    ("#created", "created_at"),
    ("#updated", "updated_at"),
    ("#ttl", "expires_at"),
    ("#outcome", "outcome"),
    ("#finished", "finished_at"),
    ("#ref", "provider_ref"),
    ("#enq", "enqueued_at"),
];

/// The DynamoDB job ledger.
#[derive(Debug, Clone)]
pub struct DynamoLedger {
    client: Client,
    table: String,
}

impl DynamoLedger {
    /// A ledger on `table` through `client`.
    pub fn new(client: Client, table: impl Into<String>) -> Self {
        DynamoLedger {
            client,
            table: table.into(),
        }
    }

    /// The table name.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// Creates a ledger table as `template.yaml` defines it (key `job_id`, the sparse attention
    /// index, on demand), for local set-ups, tests and benchmarks. TTL is not switched on here.
    pub async fn create_table(client: &Client, name: &str) -> Result<(), LedgerError> {
        use aws_sdk_dynamodb::types::{
            AttributeDefinition, BillingMode, GlobalSecondaryIndex, KeySchemaElement, KeyType,
            Projection, ProjectionType, ScalarAttributeType,
        };
        let attribute = |name: &str, kind| {
            AttributeDefinition::builder()
                .attribute_name(name)
                .attribute_type(kind)
                .build()
        };
        let key = |name: &str, kind| {
            KeySchemaElement::builder()
                .attribute_name(name)
                .key_type(kind)
                .build()
        };
        let invalid = |e: aws_sdk_dynamodb::error::BuildError| LedgerError::Unavailable {
            operation: "create_table",
            code: e.to_string(),
        };
        let index = |name: &str, sort: &str| {
            GlobalSecondaryIndex::builder()
                .index_name(name)
                .key_schema(key("attention", KeyType::Hash).map_err(invalid)?)
                .key_schema(key(sort, KeyType::Range).map_err(invalid)?)
                .projection(
                    Projection::builder()
                        .projection_type(ProjectionType::KeysOnly)
                        .build(),
                )
                .build()
                .map_err(invalid)
        };
        client
            .create_table()
            .table_name(name)
            .attribute_definitions(attribute("job_id", ScalarAttributeType::S).map_err(invalid)?)
            .attribute_definitions(attribute("attention", ScalarAttributeType::S).map_err(invalid)?)
            .attribute_definitions(
                attribute("updated_at", ScalarAttributeType::N).map_err(invalid)?,
            )
            .attribute_definitions(
                attribute("deadline_at", ScalarAttributeType::N).map_err(invalid)?,
            )
            .key_schema(key("job_id", KeyType::Hash).map_err(invalid)?)
            .global_secondary_indexes(index(ATTENTION_INDEX, "updated_at")?)
            .global_secondary_indexes(index(DEADLINE_INDEX, "deadline_at")?)
            .billing_mode(BillingMode::PayPerRequest)
            .send()
            .await
            .map_err(|e| sdk_error("create_table", &e))?;
        Ok(())
    }

    /// Jobs in `state` (not terminal), oldest update first, at most `limit`: a query of each
    /// shard of the sparse attention index, never a scan of the table.
    pub async fn list(
        &self,
        state: JobState,
        limit: usize,
    ) -> Result<Vec<(String, Millis)>, LedgerError> {
        self.keys_below(ATTENTION_INDEX, "updated_at", state, Millis::MAX, limit)
            .await
    }

    /// Jobs in `state` last changed before `before`, oldest first, at most `limit`.
    pub async fn untouched_since(
        &self,
        state: JobState,
        before: Millis,
        limit: usize,
    ) -> Result<Vec<(String, Millis)>, LedgerError> {
        self.keys_below(ATTENTION_INDEX, "updated_at", state, before, limit)
            .await
    }

    /// Jobs in `state` whose deadline is at or before `now`, earliest first, at most `limit`.
    pub async fn past_deadline(
        &self,
        state: JobState,
        now: Millis,
        limit: usize,
    ) -> Result<Vec<(String, Millis)>, LedgerError> {
        self.keys_below(
            DEADLINE_INDEX,
            "deadline_at",
            state,
            now.saturating_add(1),
            limit,
        )
        .await
    }

    /// How many jobs are in `state` (a count query of each shard; no items are read).
    pub async fn count(&self, state: JobState) -> Result<u64, LedgerError> {
        let mut total = 0u64;
        for shard in 0..ATTENTION_SHARDS {
            let mut start = None;
            loop {
                let out = self
                    .client
                    .query()
                    .table_name(&self.table)
                    .index_name(ATTENTION_INDEX)
                    .key_condition_expression("#attn = :key")
                    .expression_attribute_names("#attn", "attention")
                    .expression_attribute_values(":key", s(&attention_shard(state, shard)))
                    .select(aws_sdk_dynamodb::types::Select::Count)
                    .set_exclusive_start_key(start)
                    .send()
                    .await
                    .map_err(|e| sdk_error("count", &e))?;
                total += u64::try_from(out.count()).unwrap_or(0);
                start = out.last_evaluated_key().cloned();
                if start.is_none() {
                    break;
                }
            }
        }
        Ok(total)
    }

    /// Keys of jobs in `state` from `index` whose sort key `sort` is below `before`, smallest
    /// first, at most `limit`: a query of each shard, never a scan of the table.
    async fn keys_below(
        &self,
        index: &str,
        sort: &str,
        state: JobState,
        before: Millis,
        limit: usize,
    ) -> Result<Vec<(String, Millis)>, LedgerError> {
        let mut found = Vec::new();
        for shard in 0..ATTENTION_SHARDS {
            let mut start = None;
            let mut from_shard = 0;
            loop {
                let out = self
                    .client
                    .query()
                    .table_name(&self.table)
                    .index_name(index)
                    .key_condition_expression("#attn = :key AND #sort < :before")
                    .expression_attribute_names("#attn", "attention")
                    .expression_attribute_names("#sort", sort)
                    .expression_attribute_values(":key", s(&attention_shard(state, shard)))
                    .expression_attribute_values(":before", n(before))
                    .limit(limit.clamp(1, 1000) as i32)
                    .set_exclusive_start_key(start)
                    .send()
                    .await
                    .map_err(|e| sdk_error("query", &e))?;
                for item in out.items() {
                    if let (Some(id), Some(at)) = (get_s(item, "job_id"), get_n(item, sort)) {
                        found.push((id.to_owned(), at));
                        from_shard += 1;
                    }
                }
                start = out.last_evaluated_key().cloned();
                // Each shard is sorted: its first `limit` keys are all it can contribute.
                if start.is_none() || from_shard >= limit {
                    break;
                }
            }
        }
        found.sort_by_key(|(_, at)| *at);
        found.truncate(limit);
        Ok(found)
    }

    /// Sends one conditional `UpdateItem`. Only the placeholders the expressions use are sent
    /// (DynamoDB rejects unused ones).
    async fn update(
        &self,
        operation: &'static str,
        job_id: &str,
        update: &str,
        condition: &str,
        mut values: Vec<(&str, AttributeValue)>,
        target: Option<JobState>,
    ) -> Result<Write, LedgerError> {
        // Every write that sets a state keeps the sparse attention index in step with it.
        let mut update = update.to_owned();
        if let Some(state) = target {
            match attention_key(state, job_id) {
                Some(key) => {
                    update.push_str(", #attn = :attn");
                    values.push((":attn", s(&key)));
                }
                None => update.push_str(" REMOVE #attn"),
            }
        }
        let update = update.as_str();
        let used = |token: &str| uses_token(update, token) || uses_token(condition, token);
        let names: HashMap<String, String> = NAMES
            .iter()
            .filter(|(token, _)| used(token))
            .map(|(token, name)| ((*token).to_owned(), (*name).to_owned()))
            .collect();
        let values: HashMap<String, AttributeValue> = values
            .into_iter()
            .filter(|(token, _)| used(token))
            .map(|(token, value)| (token.to_owned(), value))
            .collect();
        let sent = self
            .client
            .update_item()
            .table_name(&self.table)
            .key("job_id", s(job_id))
            .update_expression(update)
            .condition_expression(condition)
            .set_expression_attribute_names(Some(names))
            .set_expression_attribute_values(Some(values))
            .return_values(ReturnValue::AllNew)
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .send()
            .await;
        match sent {
            Ok(out) => match out.attributes() {
                Some(item) => Ok(Write::Applied(decode(item)?)),
                // ALL_NEW always returns the item; an emulator that omits it gets one more read.
                None => match self.get(job_id).await? {
                    Some(record) => Ok(Write::Applied(record)),
                    None => Err(LedgerError::Corrupt {
                        job_id: job_id.to_owned(),
                        detail: "applied write left no item".to_owned(),
                    }),
                },
            },
            Err(SdkError::ServiceError(e)) => match e.err() {
                UpdateItemError::ConditionalCheckFailedException(refused) => match refused.item() {
                    Some(old) => Ok(Write::Refused(Some(decode(old)?))),
                    // ALL_OLD is absent when there was no item, and some emulators omit it:
                    // fall back to a consistent read.
                    None => Ok(Write::Refused(self.get(job_id).await?)),
                },
                other => Err(classify(operation, other.code())),
            },
            Err(other) => Err(transport_error(operation, &other)),
        }
    }
}

impl JobLedger for DynamoLedger {
    async fn claim(&self, req: ClaimRequest) -> Result<Write, LedgerError> {
        let job = &req.job;
        // Invariant: epoch and attempts rise together with the attempt record, before any
        // provider call; the values are the expected ones plus one, so a stale expectation is
        // refused rather than applied twice.
        let mut update = String::from(
            "SET #state = :running, #epoch = :new_epoch, #attempts = :new_attempts, \
             #owner = :owner, #until = :until, #updated = :now, \
             #log = list_append(if_not_exists(#log, :empty), :attempt), \
             #input = if_not_exists(#input, :input), #digest = if_not_exists(#digest, :digest), \
             #contract = if_not_exists(#contract, :contract), \
             #deadline = if_not_exists(#deadline, :deadline), #max = if_not_exists(#max, :max), \
             #created = if_not_exists(#created, :now), #ttl = if_not_exists(#ttl, :ttl)",
        );
        if job.metadata.is_some() {
            update.push_str(", #meta = if_not_exists(#meta, :meta)");
        }
        let claimable = "(#state IN (:ready, :retry) AND #epoch = :epoch AND #attempts = :attempts \
             AND #digest = :digest AND #attempts < #max AND #deadline > :now)";
        let condition = if req.expect.allows_absent() {
            format!("attribute_not_exists(#id) OR {claimable}")
        } else {
            claimable.to_owned()
        };
        let attempt = AttemptRecord {
            number: req.expect.attempts + 1,
            epoch: req.expect.epoch + 1,
            owner_id: req.owner_id.clone(),
            started_at: req.now,
            provider_ref: req.provider_ref.clone(),
            outcome: AttemptOutcome::Pending,
            finished_at: None,
        };
        let mut values = new_job_values(job);
        values.extend([
            (":running", s(JobState::Running.as_str())),
            (":ready", s(JobState::Ready.as_str())),
            (":retry", s(JobState::RetryAuthorized.as_str())),
            (":epoch", n(req.expect.epoch)),
            (":attempts", n(req.expect.attempts)),
            (":new_epoch", n(req.expect.epoch + 1)),
            (":new_attempts", n(req.expect.attempts + 1)),
            (":owner", s(&req.owner_id)),
            (":until", n(req.lease_until)),
            (":now", n(req.now)),
            (":empty", AttributeValue::L(Vec::new())),
            (
                ":attempt",
                AttributeValue::L(vec![encode_attempt(&attempt)]),
            ),
        ]);
        self.update(
            "claim",
            &job.job_id,
            &update,
            &condition,
            values,
            Some(JobState::Running),
        )
        .await
    }

    async fn finish(&self, req: FinishRequest) -> Result<Write, LedgerError> {
        let index = req.attempt.saturating_sub(1);
        let mut update = format!(
            "SET #state = :to, #updated = :now, #log[{index}].#outcome = :outcome, \
             #log[{index}].#finished = :now"
        );
        // Invariant: only the owner at the current epoch, still running, ends its attempt; a
        // result is accepted only before the deadline.
        let mut condition = String::from("#state = :running AND #epoch = :epoch");
        let mut values = vec![
            (":to", s(req.end.target().as_str())),
            (":now", n(req.now)),
            (":outcome", s(req.end.attempt_outcome().as_str())),
            (":running", s(JobState::Running.as_str())),
            (":epoch", n(req.epoch)),
        ];
        if let AttemptEnd::Succeeded { result } = &req.end {
            update.push_str(", #result = :result");
            condition.push_str(" AND #deadline > :now");
            values.push((":result", s(result)));
        }
        if let Some(error) = req.end.error(req.now) {
            update.push_str(", #err = :err");
            values.push((":err", encode_error(&error)));
        }
        if let Some(decision) = req.decision() {
            update.push_str(", #dec = list_append(if_not_exists(#dec, :empty), :decision)");
            values.push((":empty", AttributeValue::L(Vec::new())));
            values.push((
                ":decision",
                AttributeValue::L(vec![encode_decision(&decision)]),
            ));
        }
        let target = Some(req.end.target());
        self.update("finish", &req.job_id, &update, &condition, values, target)
            .await
    }

    async fn settle(&self, req: SettleRequest) -> Result<Write, LedgerError> {
        let mut values = vec![
            (":to", s(req.reason.target().as_str())),
            (":now", n(req.now)),
            (":err", encode_error(&req.error())),
        ];
        let (update, condition) = match &req.from {
            SettleFrom::Absent(job) => {
                // Invariant: a job that arrives after its deadline is recorded terminal, once.
                values.extend(new_job_values(job));
                values.extend([(":zero", n(0)), (":empty", AttributeValue::L(Vec::new()))]);
                let mut update = String::from(
                    "SET #state = :to, #epoch = :zero, #attempts = :zero, #max = :max, \
                     #digest = :digest, #contract = :contract, #input = :input, \
                     #deadline = :deadline, #log = :empty, #err = :err, #created = :now, \
                     #updated = :now, #ttl = :ttl",
                );
                if job.metadata.is_some() {
                    update.push_str(", #meta = :meta");
                }
                (update, "attribute_not_exists(#id)".to_owned())
            }
            SettleFrom::PastDeadline => {
                // Invariant: past its deadline no job may run or accept, so whoever owns it is
                // fenced by the state change; a terminal item is never rewritten.
                values.extend([
                    (":ready", s(JobState::Ready.as_str())),
                    (":running", s(JobState::Running.as_str())),
                    (":unknown", s(JobState::Unknown.as_str())),
                    (":retry", s(JobState::RetryAuthorized.as_str())),
                ]);
                (
                    "SET #state = :to, #updated = :now, #err = :err".to_owned(),
                    "#deadline <= :now AND #state IN (:ready, :running, :unknown, :retry)"
                        .to_owned(),
                )
            }
            SettleFrom::Seen { state, epoch } => {
                // Invariant: the writer saw this state at this epoch; anything newer wins, and a
                // terminal item is never rewritten.
                values.extend([
                    (":from", s(state.as_str())),
                    (":epoch", n(*epoch)),
                    (":ready", s(JobState::Ready.as_str())),
                    (":running", s(JobState::Running.as_str())),
                    (":unknown", s(JobState::Unknown.as_str())),
                    (":retry", s(JobState::RetryAuthorized.as_str())),
                ]);
                (
                    "SET #state = :to, #updated = :now, #err = :err".to_owned(),
                    "#state = :from AND #epoch = :epoch \
                     AND #state IN (:ready, :running, :unknown, :retry)"
                        .to_owned(),
                )
            }
        };
        let target = Some(req.reason.target());
        self.update("settle", &req.job_id, &update, &condition, values, target)
            .await
    }

    async fn recover(&self, req: RecoverRequest) -> Result<Write, LedgerError> {
        let recovery = RecoveryRecord {
            epoch: req.seen_epoch + 1,
            owner_id: req.owner_id.clone(),
            at: req.now,
            reason: req.reason.clone(),
        };
        // Invariant: a lapsed owner (or an unknown job) is fenced by raising the epoch it holds;
        // no attempt starts.
        let update = "SET #state = :running, #epoch = :new_epoch, #owner = :owner, \
                      #until = :until, #updated = :now, \
                      #rec = list_append(if_not_exists(#rec, :empty), :recovery)";
        let condition = "#epoch = :epoch AND \
                         ((#state = :running AND #until <= :cutoff) OR #state = :unknown)";
        let values = vec![
            (":new_epoch", n(req.seen_epoch + 1)),
            (":epoch", n(req.seen_epoch)),
            (":owner", s(&req.owner_id)),
            (":until", n(req.lease_until)),
            (":now", n(req.now)),
            (":cutoff", n(req.lapsed_before)),
            (":running", s(JobState::Running.as_str())),
            (":unknown", s(JobState::Unknown.as_str())),
            (":empty", AttributeValue::L(Vec::new())),
            (
                ":recovery",
                AttributeValue::L(vec![encode_recovery(&recovery)]),
            ),
        ];
        let target = Some(JobState::Running);
        self.update("recover", &req.job_id, update, condition, values, target)
            .await
    }

    async fn renew(&self, req: RenewRequest) -> Result<Write, LedgerError> {
        // Invariant: only the current owner extends its lease, and only before it lapses.
        let update = "SET #until = :until, #updated = :now";
        let condition = "#state = :running AND #epoch = :epoch AND #until >= :now";
        let values = vec![
            (":until", n(req.lease_until)),
            (":now", n(req.now)),
            (":running", s(JobState::Running.as_str())),
            (":epoch", n(req.epoch)),
        ];
        self.update("renew", &req.job_id, update, condition, values, None)
            .await
    }

    async fn create(&self, req: CreateRequest) -> Result<Write, LedgerError> {
        let job = &req.job;
        // Invariant: a job is created once; its input, digest, deadline and budget never change.
        let mut update = String::from(
            "SET #state = :ready, #epoch = :zero, #attempts = :zero, #max = :max, \
             #digest = :digest, #contract = :contract, #input = :input, #deadline = :deadline, \
             #log = :empty, #created = :now, #updated = :now, #ttl = :ttl",
        );
        if job.metadata.is_some() {
            update.push_str(", #meta = :meta");
        }
        let mut values = new_job_values(job);
        values.extend([
            (":ready", s(JobState::Ready.as_str())),
            (":zero", n(0)),
            (":empty", AttributeValue::L(Vec::new())),
            (":now", n(req.now)),
        ]);
        let target = Some(JobState::Ready);
        let condition = "attribute_not_exists(#id)";
        self.update("create", &job.job_id, &update, condition, values, target)
            .await
    }

    async fn mark_enqueued(&self, req: EnqueuedRequest) -> Result<Write, LedgerError> {
        let values = vec![
            (":now", n(req.now)),
            (":ready", s(JobState::Ready.as_str())),
            (":retry", s(JobState::RetryAuthorized.as_str())),
            (":running", s(JobState::Running.as_str())),
        ];
        let condition = "#state IN (:ready, :retry, :running)";
        self.update(
            "mark_enqueued",
            &req.job_id,
            "SET #enq = :now",
            condition,
            values,
            None,
        )
        .await
    }

    async fn record_ref(&self, req: RecordRefRequest) -> Result<Write, LedgerError> {
        // Invariant: only the owner at the current epoch attaches a reference to its attempt.
        let index = req.attempt.saturating_sub(1);
        let update = format!("SET #log[{index}].#ref = :ref, #updated = :now");
        let condition = "#state = :running AND #epoch = :epoch AND #attempts = :attempt";
        let values = vec![
            (":ref", s(&req.provider_ref)),
            (":now", n(req.now)),
            (":running", s(JobState::Running.as_str())),
            (":epoch", n(req.epoch)),
            (":attempt", n(req.attempt)),
        ];
        self.update("record_ref", &req.job_id, &update, condition, values, None)
            .await
    }

    async fn decide(&self, req: DecideRequest) -> Result<Write, LedgerError> {
        // Invariant: an `unknown` job leaves that state only by a recorded decision, which
        // raises the epoch so nothing holding the old one can write again.
        let update = "SET #state = :to, #epoch = :new_epoch, #owner = :by, #updated = :now, \
                      #dec = list_append(if_not_exists(#dec, :empty), :decision)";
        let condition = "#state = :unknown AND #epoch = :epoch";
        let values = vec![
            (":to", s(req.action.target().as_str())),
            (":new_epoch", n(req.epoch + 1)),
            (":by", s(&req.by)),
            (":now", n(req.now)),
            (":empty", AttributeValue::L(Vec::new())),
            (
                ":decision",
                AttributeValue::L(vec![encode_decision(&req.decision())]),
            ),
            (":unknown", s(JobState::Unknown.as_str())),
            (":epoch", n(req.epoch)),
        ];
        let target = Some(req.action.target());
        self.update("decide", &req.job_id, update, condition, values, target)
            .await
    }

    async fn get(&self, job_id: &str) -> Result<Option<JobRecord>, LedgerError> {
        let out = self
            .client
            .get_item()
            .table_name(&self.table)
            .key("job_id", s(job_id))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| sdk_error("get", &e))?;
        out.item().map(decode).transpose()
    }
}

fn new_job_values(job: &NewJob) -> Vec<(&'static str, AttributeValue)> {
    let mut values = vec![
        (":input", s(&job.input)),
        (":digest", s(&job.input_digest)),
        (":contract", s(&job.contract)),
        (":deadline", n(job.deadline_at)),
        (":max", n(job.max_attempts)),
        (":ttl", n(job.expires_at)),
    ];
    if let Some(meta) = &job.metadata {
        values.push((":meta", s(meta)));
    }
    values
}

fn classify(operation: &'static str, code: Option<&str>) -> LedgerError {
    match code {
        Some(
            "ProvisionedThroughputExceededException"
            | "ThrottlingException"
            | "RequestLimitExceeded",
        ) => LedgerError::Throttled { operation },
        Some(code) => LedgerError::Unavailable {
            operation,
            code: code.to_owned(),
        },
        // The message is not kept: a service message may quote request values.
        None => LedgerError::Unavailable {
            operation,
            code: "unclassified".to_owned(),
        },
    }
}

/// Classifies a failed request that was not a refused condition.
fn sdk_error<E: ProvideErrorMetadata, R>(
    operation: &'static str,
    err: &SdkError<E, R>,
) -> LedgerError {
    match err {
        SdkError::ServiceError(se) => classify(operation, se.err().code()),
        other => transport_error(operation, other),
    }
}

fn transport_error<E, R>(operation: &'static str, err: &SdkError<E, R>) -> LedgerError {
    let code = match err {
        SdkError::TimeoutError(_) => "timeout",
        SdkError::DispatchFailure(_) => "dispatch_failure",
        SdkError::ResponseError(_) => "response_error",
        SdkError::ConstructionFailure(_) => "construction_failure",
        _ => "sdk_error",
    };
    LedgerError::Unavailable {
        operation,
        code: code.to_owned(),
    }
}

/// True when `expr` uses `token` as a whole placeholder (`:now` is not used by `:now_x`).
fn uses_token(expr: &str, token: &str) -> bool {
    expr.match_indices(token).any(|(at, _)| {
        expr[at + token.len()..]
            .chars()
            .next()
            .is_none_or(|c| !(c.is_ascii_alphanumeric() || c == '_'))
    })
}

fn s(v: &str) -> AttributeValue {
    AttributeValue::S(v.to_owned())
}

fn n(v: impl ToString) -> AttributeValue {
    AttributeValue::N(v.to_string())
}

fn encode_attempt(a: &AttemptRecord) -> AttributeValue {
    let mut m = HashMap::from([
        ("number".to_owned(), n(a.number)),
        ("epoch".to_owned(), n(a.epoch)),
        ("owner_id".to_owned(), s(&a.owner_id)),
        ("started_at".to_owned(), n(a.started_at)),
        ("outcome".to_owned(), s(a.outcome.as_str())),
    ]);
    if let Some(r) = &a.provider_ref {
        m.insert("provider_ref".to_owned(), s(r));
    }
    if let Some(f) = a.finished_at {
        m.insert("finished_at".to_owned(), n(f));
    }
    AttributeValue::M(m)
}

fn encode_recovery(r: &RecoveryRecord) -> AttributeValue {
    AttributeValue::M(HashMap::from([
        ("epoch".to_owned(), n(r.epoch)),
        ("owner_id".to_owned(), s(&r.owner_id)),
        ("at".to_owned(), n(r.at)),
        ("reason".to_owned(), s(&r.reason)),
    ]))
}

fn encode_decision(d: &DecisionRecord) -> AttributeValue {
    AttributeValue::M(HashMap::from([
        ("epoch".to_owned(), n(d.epoch)),
        ("action".to_owned(), s(&d.action)),
        ("by".to_owned(), s(&d.by)),
        ("reason".to_owned(), s(&d.reason)),
        ("at".to_owned(), n(d.at)),
    ]))
}

fn decode_decision(v: &AttributeValue) -> Option<DecisionRecord> {
    let m = v.as_m().ok()?;
    Some(DecisionRecord {
        epoch: to_u64(get_n(m, "epoch")?)?,
        action: get_s(m, "action")?.to_owned(),
        by: get_s(m, "by")?.to_owned(),
        reason: get_s(m, "reason")?.to_owned(),
        at: get_n(m, "at")?,
    })
}

fn encode_error(e: &ErrorRecord) -> AttributeValue {
    AttributeValue::M(HashMap::from([
        ("kind".to_owned(), s(&e.kind)),
        ("message".to_owned(), s(&e.message)),
        ("at".to_owned(), n(e.at)),
    ]))
}

/// Decodes a stored item. A missing or mistyped attribute is `Corrupt`, never a panic.
pub fn decode(item: &Item) -> Result<JobRecord, LedgerError> {
    let job_id = get_s(item, "job_id").unwrap_or("?").to_owned();
    let corrupt = |detail: String| LedgerError::Corrupt {
        job_id: job_id.clone(),
        detail,
    };
    let req_s = |name: &str| {
        get_s(item, name)
            .map(str::to_owned)
            .ok_or_else(|| corrupt(format!("missing string `{name}`")))
    };
    let req_n =
        |name: &str| get_n(item, name).ok_or_else(|| corrupt(format!("missing number `{name}`")));
    let state: JobState = req_s("state")?
        .parse()
        .map_err(|e: crate::job::state::UnknownState| corrupt(e.to_string()))?;
    let attempt_log = match item.get("attempt_log") {
        None => Vec::new(),
        Some(AttributeValue::L(entries)) => entries
            .iter()
            .map(|e| decode_attempt(e).ok_or_else(|| corrupt("malformed attempt".to_owned())))
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(corrupt("attempt_log is not a list".to_owned())),
    };
    let recoveries = match item.get("recoveries") {
        None => Vec::new(),
        Some(AttributeValue::L(entries)) => entries
            .iter()
            .map(|e| decode_recovery(e).ok_or_else(|| corrupt("malformed recovery".to_owned())))
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(corrupt("recoveries is not a list".to_owned())),
    };
    let decisions = match item.get("decisions") {
        None => Vec::new(),
        Some(AttributeValue::L(entries)) => entries
            .iter()
            .map(|e| decode_decision(e).ok_or_else(|| corrupt("malformed decision".to_owned())))
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(corrupt("decisions is not a list".to_owned())),
    };
    Ok(JobRecord {
        state,
        owner_epoch: to_u64(req_n("owner_epoch")?).ok_or_else(|| corrupt("owner_epoch".into()))?,
        attempts: to_u32(req_n("attempts")?).ok_or_else(|| corrupt("attempts".into()))?,
        max_attempts: to_u32(req_n("max_attempts")?)
            .ok_or_else(|| corrupt("max_attempts".into()))?,
        input_digest: req_s("input_digest")?,
        contract: req_s("contract")?,
        input: req_s("input")?,
        metadata: get_s(item, "metadata").map(str::to_owned),
        deadline_at: req_n("deadline_at")?,
        owner_id: get_s(item, "owner_id").map(str::to_owned),
        owner_until: get_n(item, "owner_until"),
        attempt_log,
        recoveries,
        decisions,
        result: get_s(item, "result").map(str::to_owned),
        last_error: item.get("last_error").and_then(decode_error),
        created_at: req_n("created_at")?,
        updated_at: req_n("updated_at")?,
        expires_at: req_n("expires_at")?,
        enqueued_at: get_n(item, "enqueued_at"),
        job_id: job_id.clone(),
    })
}

fn decode_attempt(v: &AttributeValue) -> Option<AttemptRecord> {
    let m = v.as_m().ok()?;
    Some(AttemptRecord {
        number: to_u32(get_n(m, "number")?)?,
        epoch: to_u64(get_n(m, "epoch")?)?,
        owner_id: get_s(m, "owner_id")?.to_owned(),
        started_at: get_n(m, "started_at")?,
        provider_ref: get_s(m, "provider_ref").map(str::to_owned),
        outcome: AttemptOutcome::parse(get_s(m, "outcome")?),
        finished_at: get_n(m, "finished_at"),
    })
}

fn decode_recovery(v: &AttributeValue) -> Option<RecoveryRecord> {
    let m = v.as_m().ok()?;
    Some(RecoveryRecord {
        epoch: to_u64(get_n(m, "epoch")?)?,
        owner_id: get_s(m, "owner_id")?.to_owned(),
        at: get_n(m, "at")?,
        reason: get_s(m, "reason")?.to_owned(),
    })
}

fn decode_error(v: &AttributeValue) -> Option<ErrorRecord> {
    let m = v.as_m().ok()?;
    Some(ErrorRecord {
        kind: get_s(m, "kind")?.to_owned(),
        message: get_s(m, "message")?.to_owned(),
        at: get_n(m, "at")?,
    })
}

fn get_s<'a>(item: &'a Item, name: &str) -> Option<&'a str> {
    item.get(name)?.as_s().ok().map(String::as_str)
}

fn get_n(item: &Item, name: &str) -> Option<Millis> {
    item.get(name)?.as_n().ok()?.parse().ok()
}

fn to_u64(v: i64) -> Option<u64> {
    u64::try_from(v).ok()
}

fn to_u32(v: i64) -> Option<u32> {
    u32::try_from(v).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_match_whole_tokens_only() {
        assert!(uses_token("#a = :now", ":now"));
        assert!(!uses_token("#a = :now_x", ":now"));
        assert!(uses_token("#log[0].#outcome = :o", "#log"));
        assert!(!uses_token("#logs = :o", "#log"));
    }

    #[test]
    fn a_malformed_item_is_corrupt_not_a_panic() {
        let item = HashMap::from([
            ("job_id".to_owned(), s("j")),
            ("state".to_owned(), s("dancing")),
        ]);
        assert!(matches!(decode(&item), Err(LedgerError::Corrupt { .. })));
        let item = HashMap::from([
            ("job_id".to_owned(), s("j")),
            ("state".to_owned(), s("ready")),
        ]);
        assert!(matches!(decode(&item), Err(LedgerError::Corrupt { .. })));
    }
}
