-- The environments' event streams as recorded (store/events.rs): one row per batch the owner's
-- scheduler wrote, in the same transaction as the states and actions it reports, so that every
-- replica serves the stream and a client resumes where it stopped (`Last-Event-ID`). `events`
-- holds the batch's events, one per line: the name, a space, the JSON. Sequence numbers
-- increase across owners (each owner starts above the last one recorded and at
-- epoch × 2³²); `prev_seq` is the last number handed out before the batch, so a reader knows
-- whether what it holds joins on. `recorded_at` is the owner's clock, in milliseconds. Keep in
-- step with migrations/sqlite/0014_events.sql.

CREATE TABLE event_batches (
    environment_id TEXT    NOT NULL REFERENCES environments (id) ON DELETE CASCADE,
    first_seq      BIGINT  NOT NULL,
    last_seq       BIGINT  NOT NULL,
    prev_seq       BIGINT,
    events         TEXT    NOT NULL,
    recorded_at    BIGINT  NOT NULL,
    PRIMARY KEY (environment_id, first_seq)
);

CREATE INDEX event_batches_by_age ON event_batches (environment_id, recorded_at);
