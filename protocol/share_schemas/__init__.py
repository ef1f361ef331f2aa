"""JSON message specs of the KIP-932 share-group APIs, which kafka-python does not ship.

Written from apache/kafka's ``clients/src/main/resources/common/message/`` specs (same format, so
kafka-python's own loader compiles them); ``protocol.share_messages`` loads them.
"""
