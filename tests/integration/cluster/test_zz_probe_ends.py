import pytest
from kafka import KafkaConsumer, TopicPartition
from tests.hostile_batches import send_one_batch
pytestmark = pytest.mark.integration

def test_ends(kafka_bootstrap, kafka_topics):
    (t,) = kafka_topics(count=1, partitions=1)
    offs = send_one_batch(kafka_bootstrap, t, 0, [b"x"] * 500)
    offs += send_one_batch(kafka_bootstrap, t, 0, [b"y"] * 300)
    c = KafkaConsumer(bootstrap_servers=kafka_bootstrap)
    tp = TopicPartition(t, 0)
    print("ENDS", c.end_offsets([tp]), max(offs))
    c.close()
    assert 0
