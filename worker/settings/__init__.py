"""The service's configuration: the one ``Settings`` object (``config``), the value rules a
type cannot state (``rules``) and invalid settings as one line per problem (``errors``)."""
