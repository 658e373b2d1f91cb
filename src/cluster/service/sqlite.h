// cluster/service/sqlite — a thin RAII layer over SQLite's C API: a connection, prepared
// statements with typed binds and columns, and transactions that roll back on a throw.
// Errors are loom::Error naming the database file and SQLite's message.
#pragma once

#include <sqlite3.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace loom::service {

class Database;

class Statement {
 public:
  Statement(Database& db, std::string_view sql);
  ~Statement();
  Statement(const Statement&) = delete;
  Statement& operator=(const Statement&) = delete;

  // Binds parameters ?1, ?2, ... (1-based); std::nullopt binds NULL.
  Statement& bind(int index, std::int64_t value);
  Statement& bind(int index, double value);
  Statement& bind(int index, std::string_view value);
  Statement& bind(int index, const char* value) { return bind(index, std::string_view(value)); }
  Statement& bind(int index, const std::string& value) {
    return bind(index, std::string_view(value));
  }
  Statement& bind(int index, std::optional<double> value);
  Statement& bind(int index, std::optional<std::int64_t> value);
  Statement& bind(int index, std::optional<std::string> value);
  Statement& bind(int index, int value) { return bind(index, static_cast<std::int64_t>(value)); }

  // Steps once: true while a row is available.
  bool step();
  // Runs a statement that returns no rows.
  void run();
  void reset();

  std::int64_t integer(int column) const;
  double real(int column) const;
  std::string text(int column) const;
  bool is_null(int column) const;
  std::optional<double> optional_real(int column) const;
  std::optional<std::int64_t> optional_integer(int column) const;

 private:
  Database& db_;
  sqlite3_stmt* statement_ = nullptr;
};

class Database {
 public:
  // Opens (creating) `path`: WAL journal, synchronous=FULL (a commit survives power loss),
  // foreign keys on, a busy timeout for the readers of other threads.
  explicit Database(std::string path);
  ~Database();
  Database(const Database&) = delete;
  Database& operator=(const Database&) = delete;

  void execute(std::string_view sql);  // one or more statements, no results
  std::int64_t last_insert_id() const;
  int changes() const;
  int user_version();
  const std::string& path() const { return path_; }
  sqlite3* handle() const { return db_; }
  [[noreturn]] void fail(const std::string& what) const;

 private:
  std::string path_;
  sqlite3* db_ = nullptr;
};

// BEGIN IMMEDIATE (the write lock taken at once, so the transaction cannot fail later on
// a conflict) ... COMMIT; a transaction left without commit() rolls back.
class Transaction {
 public:
  explicit Transaction(Database& db);
  ~Transaction();
  Transaction(const Transaction&) = delete;
  Transaction& operator=(const Transaction&) = delete;
  void commit();

 private:
  Database& db_;
  bool done_ = false;
};

}  // namespace loom::service
