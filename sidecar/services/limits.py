"""Documented input limits (README "Limits"). Text limits are bytes of UTF-8."""

MAX_MESSAGE_TEXT = 256 * 1024
MAX_BATCH_MESSAGES = 1000
MAX_TITLE = 1024
MAX_METADATA_ENTRIES = 64
MAX_METADATA_VALUE = 4096
MAX_FACT_VALUE = 8 * 1024
MAX_FACTS_PER_CALL = 200
MAX_RUN_TEXT = 16 * 1024
MAX_CHECKPOINT_STATE = 4 * 1024 * 1024
MAX_LIST_NEWEST = 10_000
MAX_PAGE_SIZE = 500
# A session holding this many messages takes no more (start a new session; the summary carries on).
MAX_SESSION_MESSAGES = 100_000
# The last millisecond of 9999-12-31 (UTC): a later time is no calendar date.
MAX_TIMESTAMP_MS = 253_402_300_799_999
# ImportSessions: sessions and messages in one call (one transaction).
MAX_IMPORT_SESSIONS = 1000
MAX_IMPORT_MESSAGES = 10_000
