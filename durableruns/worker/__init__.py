"""The process around the engine: threads that claim runs as separate workers do, one heartbeat for every lease
the process holds, a listener that wakes idle threads, and the way the process stops."""
