#pragma once
// Exception hierarchy of sparsecomm. Messages start with the component and,
// where one is involved, the rank: "[ring] rank 3: ...".

#include <stdexcept>
#include <string>

namespace sparsecomm {

// Base of every error sparsecomm throws.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A caller passed a value that can never work (bad size, unknown name, ...).
class InvalidArgument : public Error {
 public:
  using Error::Error;
};

// The operation exists but this build or backend cannot do it.
class NotSupported : public Error {
 public:
  using Error::Error;
};

// A communication operation failed (peer failure, size mismatch, MPI error).
class CommError : public Error {
 public:
  using Error::Error;
};

// A blocking communication call did not complete within its timeout.
class TimeoutError : public CommError {
 public:
  using CommError::CommError;
};

// Another rank of the same world failed; this rank's pending call was
// cancelled because of it.
class PeerFailure : public CommError {
 public:
  using CommError::CommError;
};

}  // namespace sparsecomm
