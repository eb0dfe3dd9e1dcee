"""Routing of model calls: endpoints and their registry, providers behind one interface, fair
slots per endpoint, rate limits and the prompt cache's TTL."""
