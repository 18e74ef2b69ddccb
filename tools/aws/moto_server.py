"""moto's server (scripts/aws start runs this instead of the plain `moto_server`), with one fix.

moto numbers a Kinesis shard's records as "the highest sequence number so far, plus one", and its
threaded server runs PutRecords calls side by side: two calls writing to one shard at once can take
the same number, and the later record replaces the earlier one. outboxd's Kinesis sink keeps
several calls in flight (one record of a key at a time, many keys at once), so under load a test
read a stream one record short: a loss that AWS would not have made. A lock around a shard's
append makes each one whole, as Kinesis's own are. Nothing else in moto is changed.
"""

import sys
import threading

from moto.kinesis import models
from moto.server import main

_APPEND = threading.Lock()
_put_record = models.Shard.put_record


def put_record(self, *args, **kwargs):
    with _APPEND:
        return _put_record(self, *args, **kwargs)


models.Shard.put_record = put_record

if __name__ == "__main__":
    sys.exit(main())
