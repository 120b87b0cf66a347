package io.monsoon.platform;

/** An error answered with ThingsBoard's error JSON: {"status","message","errorCode","timestamp"}. */
final class ApiException extends RuntimeException {
    static final int GENERAL = 2;
    static final int AUTHENTICATION = 10;
    static final int JWT_TOKEN_EXPIRED = 11;
    static final int PERMISSION_DENIED = 20;
    static final int INVALID_ARGUMENTS = 30;
    static final int BAD_REQUEST_PARAMS = 31;
    static final int ITEM_NOT_FOUND = 32;

    final int status;
    final int errorCode;

    ApiException(int status, int errorCode, String message) {
        super(message);
        this.status = status;
        this.errorCode = errorCode;
    }

    static ApiException notFound() {
        return new ApiException(404, ITEM_NOT_FOUND, "Requested item wasn't found!");
    }

    static ApiException badRequest(String message) {
        return new ApiException(400, BAD_REQUEST_PARAMS, message);
    }
}
