//! BENCHMARK ONLY. The `bench-memory` adaptor manages no device: a resource's state is a JSON
//! value in the host's `kv` store, so deploying it measures the host (scheduler, store, Wasm
//! calls), not a transport. Do not use it to manage anything.
//!
//! Resource type `bench-memory`; the kv key is the resource id (unique per node and key). The
//! attributes are any JSON object and are the desired value as a whole. read = kv get,
//! diff = JSON comparison (one change, field `value`), apply = kv set, delete = kv delete.
//! Current state: the stored value, i.e. the attributes last applied.

use orc_sdk::{Adaptor, Change, Changes, Result, Target, kv};
use serde_json::Value;

pub struct BenchMemory;

orc_sdk::export!(adaptor: BenchMemory);

impl Adaptor for BenchMemory {
    type Desired = Value;
    type Current = Value;

    fn read(target: &Target, _desired: &Value) -> Result<Option<Value>> {
        kv::get_json(&target.id)
    }

    fn diff(_target: &Target, desired: &Value, current: Option<&Value>) -> Result<Vec<Change>> {
        Ok(Changes::new().compare("value", current, desired).into_vec())
    }

    fn apply(target: &Target, desired: &Value, _current: Option<&Value>, _changes: &[Change]) -> Result<Vec<String>> {
        kv::set_json(&target.id, desired)?;
        Ok(Vec::new())
    }

    fn delete(target: &Target, _current: &Value) -> Result<Vec<String>> {
        kv::delete(&target.id)?;
        Ok(Vec::new())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use orc_sdk::adaptor::raw;
    use serde_json::json;

    #[test]
    fn diff_compares_the_whole_value() {
        let t = Target {
            id: "bench-memory[n1,r1]".into(),
            resource_type: "bench-memory".into(),
            node: "n1".into(),
            key: "r1".into(),
            attributes_json: r#"{"n":1}"#.into(),
        };
        assert!(raw::diff::<BenchMemory>(&t, Some(r#"{"n":1}"#)).unwrap().is_empty());
        assert_eq!(
            raw::diff::<BenchMemory>(&t, None).unwrap(),
            vec![Change::new("value", None, Some(json!({"n": 1})))]
        );
        assert_eq!(
            raw::diff::<BenchMemory>(&t, Some(r#"{"n":2}"#)).unwrap()[0].current,
            Some(json!({"n": 2}))
        );
    }
}
