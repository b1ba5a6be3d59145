//! The group as its coordinator describes it ([`GroupDescriber`]): each live member's
//! name and the partitions of the topic it is assigned, for classic and KIP-848 groups
//! alike. It is librdkafka's `DescribeConsumerGroups`, which the rdkafka crate does not
//! wrap; the classic protocol's `DescribeGroups` that `fetch_group_list` sends sees a
//! KIP-848 group as empty.
//!
//! A member that died is listed until its session times out, as the broker still counts
//! it. This module only reads the group; what a host makes of it is the caller's.

use crate::kafka::client_config;
use anyhow::{Context, Result, bail};
use rdkafka::bindings as rd;
use rdkafka::consumer::{BaseConsumer, Consumer};
use std::collections::{BTreeMap, BTreeSet};
use std::ffi::{CStr, CString, c_char};
use std::time::Duration;

/// One live member of the group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupMember {
    /// What the member is known by across rejoins: its `group.instance.id` where it
    /// has one, else its `client.id` (see `KafkaOptions::member_name`).
    pub name: String,
    /// The partitions of the topic asked about that it is assigned.
    pub partitions: BTreeSet<u32>,
}

/// Describes one group, as seen by one topic, with a client of its own.
pub struct GroupDescriber {
    client: BaseConsumer,
    group: CString,
    topic: String,
}

impl GroupDescriber {
    /// A describer of `group`'s members and their partitions of `topic`, on
    /// `brokers` (`properties`, the source's, carry the security settings).
    pub fn new(brokers: &str, properties: &BTreeMap<String, String>, group: &str, topic: &str) -> Result<Self> {
        // Not a member: no group.id, so it never joins the group it describes.
        let mut properties = properties.clone();
        properties.remove("group.id");
        properties.remove("group.instance.id");
        let client = client_config(brokers, &[], &properties).create().context("creating a Kafka admin client")?;
        let group = CString::new(group).context("a group name with a NUL byte")?;
        Ok(GroupDescriber { client, group, topic: topic.to_string() })
    }

    /// The group's live members, each with its partitions of the topic; waits up to
    /// `timeout` for the coordinator.
    pub fn describe(&self, timeout: Duration) -> Result<Vec<GroupMember>> {
        let group = self.group.to_string_lossy();
        let timeout_ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
        // SAFETY: the client outlives the call; every librdkafka object made here is
        // destroyed by its guard, and what the result points to is read before the
        // event holding it is destroyed.
        unsafe {
            let rk = self.client.client().native_ptr();
            let queue = Guard(rd::rd_kafka_queue_new(rk), rd::rd_kafka_queue_destroy);
            let options = Guard(
                rd::rd_kafka_AdminOptions_new(rk, rd::rd_kafka_admin_op_t::RD_KAFKA_ADMIN_OP_DESCRIBECONSUMERGROUPS),
                rd::rd_kafka_AdminOptions_destroy,
            );
            let mut errstr = [0 as c_char; 256];
            rd::rd_kafka_AdminOptions_set_request_timeout(options.0, timeout_ms, errstr.as_mut_ptr(), errstr.len());
            let mut groups = [self.group.as_ptr()];
            rd::rd_kafka_DescribeConsumerGroups(rk, groups.as_mut_ptr(), 1, options.0, queue.0);
            let event = rd::rd_kafka_queue_poll(queue.0, timeout_ms.saturating_add(1_000));
            if event.is_null() {
                bail!("describing group {group}: no answer in {timeout:?}");
            }
            let event = Guard(event, rd::rd_kafka_event_destroy);
            if rd::rd_kafka_event_error(event.0) != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
                bail!("describing group {group}: {}", text(rd::rd_kafka_event_error_string(event.0)));
            }
            let result = rd::rd_kafka_event_DescribeConsumerGroups_result(event.0);
            let mut count = 0;
            let described = rd::rd_kafka_DescribeConsumerGroups_result_groups(result, &mut count);
            let Some(&description) = (count > 0).then(|| &*described) else {
                bail!("describing group {group}: the answer holds no group");
            };
            let error = rd::rd_kafka_ConsumerGroupDescription_error(description);
            if !error.is_null() {
                bail!("describing group {group}: {}", text(rd::rd_kafka_error_string(error)));
            }
            let members = (0..rd::rd_kafka_ConsumerGroupDescription_member_count(description))
                .map(|i| self.member(rd::rd_kafka_ConsumerGroupDescription_member(description, i)))
                .collect();
            Ok(members)
        }
    }

    /// `member`'s name and partitions of the topic.
    ///
    /// # Safety
    /// `member` points into a live `DescribeConsumerGroups` result.
    unsafe fn member(&self, member: *const rd::rd_kafka_MemberDescription_t) -> GroupMember {
        // SAFETY: as the caller promises; a list's elements are `cnt` partitions.
        unsafe {
            let instance = text(rd::rd_kafka_MemberDescription_group_instance_id(member));
            let name =
                if instance.is_empty() { text(rd::rd_kafka_MemberDescription_client_id(member)) } else { instance };
            let assignment = rd::rd_kafka_MemberDescription_assignment(member);
            let list = if assignment.is_null() {
                std::ptr::null()
            } else {
                rd::rd_kafka_MemberAssignment_partitions(assignment)
            };
            let elements = match list.as_ref() {
                Some(list) if list.cnt > 0 => std::slice::from_raw_parts(list.elems, list.cnt as usize),
                _ => &[],
            };
            let partitions = elements
                .iter()
                .filter(|e| text(e.topic) == self.topic)
                .filter_map(|e| u32::try_from(e.partition).ok())
                .collect();
            GroupMember { name, partitions }
        }
    }
}

/// A librdkafka object destroyed when the guard goes.
struct Guard<T>(*mut T, unsafe extern "C" fn(*mut T));

impl<T> Drop for Guard<T> {
    fn drop(&mut self) {
        if !self.0.is_null() {
            // SAFETY: made by the librdkafka constructor matching the destructor.
            unsafe { (self.1)(self.0) }
        }
    }
}

/// A librdkafka string, or "" for none.
///
/// # Safety
/// `text` is null or a NUL-terminated string.
unsafe fn text(text: *const c_char) -> String {
    if text.is_null() {
        return String::new();
    }
    // SAFETY: as the caller promises.
    unsafe { CStr::from_ptr(text) }.to_string_lossy().into_owned()
}
