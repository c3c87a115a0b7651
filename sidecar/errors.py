"""Domain errors. The gRPC layer maps each class to one status code; messages name the field."""

from __future__ import annotations


class SidecarError(Exception):
    """Base class: `message` is shown to the client as the status details."""

    code_name = "INTERNAL"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidArgument(SidecarError):
    code_name = "INVALID_ARGUMENT"


class NotFound(SidecarError):
    code_name = "NOT_FOUND"


class AlreadyExists(SidecarError):
    code_name = "ALREADY_EXISTS"


class FailedPrecondition(SidecarError):
    code_name = "FAILED_PRECONDITION"


class ResourceExhausted(SidecarError):
    code_name = "RESOURCE_EXHAUSTED"


class PermissionDenied(SidecarError):
    code_name = "PERMISSION_DENIED"

