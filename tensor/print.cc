#include "tensor/print.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace shardmap {
namespace {

using Lines = std::vector<std::string>;

// Which indices of a dim are shown; -1 marks the "..." gap.
std::vector<int64_t> ShownIndices(int64_t size, const PrintOptions& o) {
  std::vector<int64_t> idx;
  const int64_t half = std::max<int64_t>(1, o.edge_items / 2);
  if (size <= o.max_per_dim || size <= 2 * half) {
    for (int64_t i = 0; i < size; ++i) idx.push_back(i);
  } else {
    for (int64_t i = 0; i < half; ++i) idx.push_back(i);
    idx.push_back(-1);
    for (int64_t i = size - half; i < size; ++i) idx.push_back(i);
  }
  return idx;
}

std::string FormatElement(const Tensor& t, int64_t flat, int precision) {
  if (t.dtype() == DType::kI64) return absl::StrCat(t.data<int64_t>()[flat]);
  if (t.dtype() == DType::kI32) return absl::StrCat(t.data<int32_t>()[flat]);
  const double v = t.at(flat);
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return absl::StrFormat("%.*g", precision, v);
}

std::string PadRight(const std::string& s, size_t w) {
  return s.size() >= w ? s : s + std::string(w - s.size(), ' ');
}

class Printer {
 public:
  Printer(const Tensor& t, const PrintOptions& o) : t_(t), o_(o) {
    const int r = t.rank();
    strides_.assign(r, 1);
    for (int i = r - 2; i >= 0; --i) strides_[i] = strides_[i + 1] * t.shape()[i + 1];
    for (int i = 0; i < r; ++i) shown_.push_back(ShownIndices(t.shape()[i], o));
    width_ = 0;
    MeasureWidth(0, 0);
  }

  Lines Render() { return t_.rank() == 1 ? Lines{Row(0)} : Block(0, 0); }

 private:
  // Width of the widest shown element, so every column of every block lines up.
  void MeasureWidth(int d, int64_t base) {
    if (d == t_.rank()) {
      width_ = std::max(width_, FormatElement(t_, base, o_.precision).size());
      return;
    }
    for (int64_t i : shown_[d]) {
      if (i >= 0) MeasureWidth(d + 1, base + i * strides_[d]);
    }
  }

  std::string Elem(int64_t flat) {
    const std::string s = FormatElement(t_, flat, o_.precision);
    return std::string(width_ - s.size(), ' ') + s;
  }

  // "[a, b, ..., c]" for the last dim starting at flat offset base.
  std::string Row(int64_t base) {
    const int d = t_.rank() - 1;
    std::vector<std::string> parts;
    for (int64_t i : shown_[d]) parts.push_back(i < 0 ? "..." : Elem(base + i * strides_[d]));
    return absl::StrCat("[", absl::StrJoin(parts, ", "), "]");
  }

  // The innermost two dims as "[[...],\n [...]]".
  Lines Matrix(int64_t base) {
    const int d = t_.rank() - 2;
    Lines lines;
    const std::vector<int64_t>& rows = shown_[d];
    for (size_t k = 0; k < rows.size(); ++k) {
      const std::string body = rows[k] < 0 ? "..." : Row(base + rows[k] * strides_[d]);
      const bool last = k + 1 == rows.size();
      lines.push_back(absl::StrCat(k == 0 ? "[" : " ", body, last ? "]" : ","));
    }
    if (rows.empty()) lines.push_back("[]");
    return lines;
  }

  // Dims d..rank-1 starting at base: odd dims from the end (-3, -5, ...) lay their blocks side by
  // side, even ones (-4, -6, ...) stack them, so every axis has its own direction and separator.
  Lines Block(int d, int64_t base) {
    const int r = t_.rank();
    if (d == r - 2) return Matrix(base);
    const int from_end = r - d;  // 3 for dim -3
    std::vector<Lines> children;
    for (int64_t i : shown_[d]) {
      children.push_back(i < 0 ? Lines{"..."} : Block(d + 1, base + i * strides_[d]));
    }
    Lines out;
    if (from_end % 2 == 1) {  // side by side
      const std::string sep =
          from_end == 3 ? "   " : absl::StrCat("  ", std::string((from_end - 3) / 2, '|'), "  ");
      size_t height = 0;
      for (const Lines& c : children) height = std::max(height, c.size());
      out.assign(height, "");
      for (size_t c = 0; c < children.size(); ++c) {
        size_t w = 0;
        for (const std::string& l : children[c]) w = std::max(w, l.size());
        for (size_t h = 0; h < height; ++h) {
          const std::string cell = h < children[c].size() ? children[c][h] : "";
          out[h] += (c == 0 ? "" : sep) + PadRight(cell, w);
        }
      }
    } else {  // stacked
      size_t w = 0;
      for (const Lines& c : children) {
        for (const std::string& l : c) w = std::max(w, l.size());
      }
      for (size_t c = 0; c < children.size(); ++c) {
        if (c > 0) out.push_back(from_end == 4 ? "" : std::string(w, '-'));
        out.insert(out.end(), children[c].begin(), children[c].end());
      }
    }
    return out;
  }

  const Tensor& t_;
  const PrintOptions& o_;
  std::vector<int64_t> strides_;
  std::vector<std::vector<int64_t>> shown_;
  size_t width_;
};

}  // namespace

std::string ToString(const Tensor& tensor, const PrintOptions& options) {
  if (!tensor.defined()) return "<undefined tensor>";
  std::string out = tensor.ShapeString();
  if (tensor.is_meta()) return out + " on meta (no data)";  // values would all read 0
  if (tensor.is_cuda()) out += " on " + tensor.device().ToString();
  out += "\n";
  const Tensor t = tensor.To(Device::Cpu());  // one copy, not one per element
  if (t.rank() == 0) return out + FormatElement(t, 0, options.precision);
  if (t.numel() == 0) return out + "[]";
  Lines lines = Printer(t, options).Render();
  for (std::string& l : lines) {  // padding for alignment leaves trailing blanks: drop them
    l.erase(l.find_last_not_of(' ') + 1);
  }
  return out + absl::StrJoin(lines, "\n");
}

std::ostream& operator<<(std::ostream& os, const Tensor& t) { return os << ToString(t); }

}  // namespace shardmap
