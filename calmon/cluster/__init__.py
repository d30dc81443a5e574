"""Scaled out (contract §7): one owner per model's recalibration, on Kafka's own
partitions, consumer groups and transactions.

- ``batch``: the joined-sample micro-batch format (columns, not a record per sample);
- ``sender``: what each instance writes to ``kafka.joined_topic`` (an outbox kept in the
  checkpoint, so a batch is sent at least once and dropped by the owner when re-sent);
- ``owner``: per-model sample rings fed from the joined topic, deduplicated by source
  offset, driving the one ``Policy`` that ``replay --recalibrate`` runs (pure, in memory);
- ``kafka``: the consumer group, the transactional producer per owned partition and the
  calibrators topic read back to a marker (the only module here that talks to Kafka).

With ``kafka.instance.count`` 1 (or no instance) none of this runs.
"""
