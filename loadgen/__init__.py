"""What clients do: Locust users that stream from OpenAI-compatible endpoints and record timings."""
