//! The phrases the sources log, and put in the errors that stop a job, that a reader or
//! a test looks for: a line the file source skips; the Kafka consumer's rebalances,
//! resumes, retries and failures. Each is written once, here, and used where its line
//! is written, so rewording one fails the build of whatever looks for it; the lines
//! around the phrases stay in the sources. [`crate::events`] re-exports them with every
//! other component's phrases.

// The file source's (`file.rs`).
/// Logged for a line skipped for its length.
pub const LINE_TOO_LONG: &str = "line skipped, too long";

// The Kafka consumer's (`kafka.rs`).
/// Logged when a rebalance assigns partitions: `assigned partitions [0, 2] of <topic>`.
pub const ASSIGNED: &str = "assigned partitions";

/// Logged when a rebalance revokes partitions: `revoked partitions [1] of <topic>`.
pub const REVOKED: &str = "revoked partitions";

/// Logged when a started partition resumes: `resumed at offset N after …`.
pub const RESUMED: &str = "resumed at offset";

/// Logged when a started partition could not resume: `partition 1 could not resume;
/// trying again in 2s, …`.
pub const RESUME_RETRY: &str = "could not resume; trying again in";

/// Said when the consumer failed for good: `… this member can no longer take part in
/// its group`.
pub const MEMBER_FAILED: &str = "this member can no longer take part in its group";

/// Logged at the first record from Kafka carrying a header of a reserved name.
pub const RESERVED_HEADER: &str = "carries a header only sluice sets";

/// What to do when a topic has more partitions than the job's state: the state is kept
/// per partition, and Kafka's partitioner now sends some keys elsewhere.
pub const PARTITIONS_ADDED: &str = "if partitions were added to the topic since the job's state was written, \
     Kafka now sends some keys to other partitions than before, and their state (kept per partition) cannot follow \
     them: the job stops rather than split a key's state. Run a new job for the new partition count (a new state \
     dir, checkpoint store and consumer group, [state] partitions = the topic's) that reads the topic from the \
     start; a new job on this topic only needs [state] partitions set to the topic's";

/// Said when a partition's state is older than its log's earliest record.
pub const OUT_OF_RANGE: &str = "records after the state's offset are gone";
