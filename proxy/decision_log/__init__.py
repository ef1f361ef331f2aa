"""The decision log's writers, in one place (what they write is :mod:`quotas.decision_events`, shared with the
Spark job, which may not import ``proxy``).

* :mod:`proxy.decision_log.writer`: :class:`~proxy.decision_log.writer.DecisionLog`, the bounded queue the event
  loop emits into and the writer thread that drains it into rotating Parquet or JSON-lines files and hands each
  batch to the topic; :func:`~proxy.decision_log.writer.iter_events` reads files back;
* :mod:`proxy.decision_log.topic`: :class:`~proxy.decision_log.topic.TopicSink`, the events to a Kafka topic
  (``decision_log.topic``), one JSON object per record, from the writer thread.

Imports nothing itself: pyarrow (the writer's, at construction) and kafka-python's producer (the topic's, at
first use) load only when a log is configured.
"""
