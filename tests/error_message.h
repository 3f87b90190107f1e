#pragma once
// The message of the exception a call throws: the one helper of the tests
// that check what an error says.

#include <exception>
#include <string>
#include <type_traits>

namespace sparsecomm::testing {

// e.what() of the `E` that `call` throws; "wrong exception type: ..." for
// any other exception and "" when it throws nothing, so that an expectation
// on the message fails in both cases.
template <class E = std::exception, class F>
std::string error_message(F&& call) {
  if constexpr (std::is_same_v<E, std::exception>) {
    try {
      call();
    } catch (const std::exception& e) {
      return e.what();
    }
  } else {
    try {
      call();
    } catch (const E& e) {
      return e.what();
    } catch (const std::exception& e) {
      return std::string("wrong exception type: ") + e.what();
    }
  }
  return "";
}

}  // namespace sparsecomm::testing
