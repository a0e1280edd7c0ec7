"""State every worker of the fleet shares, kept in Redis: the key table, delivery counts and
the fleet-wide rate limit, the provider breaker, the attempt journal and the dead letters."""
